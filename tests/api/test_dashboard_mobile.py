"""The dashboard on a phone (390 CSS px, on call): no sideways scroll, every control
reachable; and what it says about a replica that refuses our password."""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from replag.lab.server import free_port
from tests.api.test_dashboard import serve_dashboard
from tests.helpers.browser import CHROMIUM, chromium, evaluate_when_loaded
from tests.helpers.cli import spawn_replag
from tests.helpers.redis_servers import primary_and_replicas
from tests.helpers.serve_process import pair_state
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")

PHONE = 390
LAYOUT = """(() => {
  const width = document.documentElement.clientWidth;
  const controls = [...document.querySelectorAll("button, a, select, input")]
    .filter((e) => getComputedStyle(e).display !== "none" && !e.closest("[hidden]"))
    .map((e) => { const r = e.getBoundingClientRect();
      return { text: e.textContent.trim().slice(0, 24), left: r.left, right: r.right,
               width: r.width, height: r.height }; });
  const axes = [...document.querySelectorAll("svg.chart text.tz")].map((e) => e.textContent);
  const legend = [...document.querySelectorAll("#legend > span")].map((e) => e.textContent);
  return { width, scrollWidth: document.documentElement.scrollWidth,
           bodyWidth: document.body.scrollWidth, controls, axes, legend,
           range: document.querySelector("#range button.active").dataset.range };
})()"""


@pytest.fixture
def dashboard_url(tmp_path: Path) -> Iterator[str]:
    yield from serve_dashboard(tmp_path)


async def test_usable_at_390_px(dashboard_url: str, tmp_path: Path) -> None:
    page = await evaluate_when_loaded(tmp_path, dashboard_url, LAYOUT, width=PHONE)
    assert page["width"] == PHONE
    # Nothing wider than the screen: the page never scrolls sideways.
    assert page["scrollWidth"] <= PHONE and page["bodyWidth"] <= PHONE, page
    # Every control on screen and of a size a thumb can hit (the range picker was 2 px).
    assert len(page["controls"]) >= 9  # 5 ranges, 4 footer links
    off = [c for c in page["controls"] if c["left"] < 0 or c["right"] > PHONE + 0.5]
    tiny = [c for c in page["controls"] if c["width"] < 12 or c["height"] < 12]
    assert off == [] and tiny == [], (off, tiny)
    ranges = [c for c in page["controls"] if c["text"] in ("15m", "1h", "6h", "24h", "7d")]
    assert len(ranges) == 5 and all(c["width"] >= 40 and c["height"] >= 30 for c in ranges)
    # Times on the axes say their zone; amber and red say different things.
    assert page["axes"] and all(
        re.fullmatch(r"time \(UTC([+-]\d+(:\d\d)?)?\)", a) for a in page["axes"]
    )
    assert len(set(page["legend"][:3])) == 3, page["legend"]
    # Data from 90 minutes ago on a service up for seconds: 15 minutes by default (a new
    # install's few minutes of data would fill a corner of the hour).
    assert page["range"] == "15m"


def test_a_replica_refusing_the_password_is_unreachable_auth_failed(tmp_path: Path) -> None:
    with primary_and_replicas(tmp_path / "redis", replicas=1) as (primary, replica):
        with replica.client() as client:
            client.config_set("requirepass", "not-the-one-we-have")
        config = tmp_path / "replag.toml"
        config.write_text(
            f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\ncount = 10\nrate = 0\n'
            'timeout = "1s"\nprobe_interval = "1s"\n'
            # It answers every command at once (NOAUTH): a long connect timeout costs nothing
            # and keeps a starved machine's slow answer from being a round's "no answer".
            'connect_timeout = "10s"\n'
            f'[[regions]]\nname = "home"\nwrite = "{primary.url}"\n'
            f'[[regions]]\nname = "far"\nreplicas = ["{replica.url}"]\n'
        )
        port = free_port()
        proc = spawn_replag(
            "serve", "-c", str(config), "--port", str(port), log=tmp_path / "serve.log"
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(
                lambda: _unreachable(base, proc),
                "a probe round refused by the replica's password",
                timeout_s=90,
            )
            dom = chromium(tmp_path, "--dump-dom", base + "/?range=15m")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    (tile,) = re.findall(
        r'(<td class="cell sev-\w+[^"]*" data-source="home" data-target="far".*?</td>)', dom, re.S
    )
    assert "sev-critical" in tile and "unreachable: auth failed" in tile
    # It saw none of its probes: 100 % lost, as its chart says (not "0% lost").
    assert "· 100% lost" in tile


def _unreachable(base: str, proc: subprocess.Popen[Any]) -> bool:
    assert proc.poll() is None, "replag serve exited"
    try:
        health = httpx.get(base + "/api/v1/health").json()
    except httpx.TransportError:
        return False
    probe = health["probes"].get("home") or {}
    refused = [u for u in probe.get("unreachable") or [] if "authentication" in u["error"]]
    return bool(refused) and bool(health["pairs"])


TILE = """(() => {
  const td = document.querySelector('td.cell[data-source="a"][data-target="b"]');
  if (!td) return null;
  const box = td.getBoundingClientRect();
  const flags = [...td.querySelectorAll(".flag")].map((f) => ({ text: f.textContent,
    clipped: f.scrollWidth > f.clientWidth + 1
      || f.getBoundingClientRect().right > box.right + 1 }));
  const heads = [...document.querySelectorAll("table.replication th, table.replication td")]
    .filter((e) => getComputedStyle(e).display !== "none")
    .map((e) => ({ text: e.textContent.trim().slice(0, 20),
                   right: e.getBoundingClientRect().right }));
  return { cls: td.className, text: td.textContent, flags, heads,
           width: document.documentElement.clientWidth };
})()"""


def _tile(tmp_path: Path, base: str, width: int) -> Any:
    return asyncio.run(evaluate_when_loaded(tmp_path, base + "/?range=15m", TILE, width=width))


def _pair_state(base: str, proc: subprocess.Popen[Any], want: str, recovered: bool) -> bool:
    assert proc.poll() is None, "replag serve exited"
    return pair_state(base, "a", "b", want, recovered)


def test_a_partitioned_pair_is_red_now_and_says_when_it_recovered(
    lab_factory: Any, tmp_path: Path
) -> None:
    """A real lab, partitioned then healed under `serve`: the tile is red while the pair does
    not replicate (whatever its window's figures), and after the heal takes the live colour
    and says since when; at 1400 and 390 px, nothing in the tile cut off."""
    from replag.config import render_config
    from replag.lab.cluster import lab_fault, lab_topology

    state = lab_factory(regions=("a", "b"), delays_ms={"b": 1})
    lab_dir = Path(state["dir"])
    config = tmp_path / "replag.toml"
    config.write_text(render_config(lab_topology(state), settings={
        "store": str(tmp_path / "s.sqlite"), "probe_interval": "1s", "count": 10, "rate": 0,
        "timeout": "1s", "replication_interval": "1s"}))  # fmt: skip
    port = free_port()
    proc = spawn_replag("serve", "-c", str(config), "--port", str(port), log=tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    shots = tmp_path / "shots"
    shots.mkdir()
    try:
        wait_until(lambda: _pair_state(base, proc, "ok", False), "a→b probed", timeout_s=120)
        lab_fault(lab_dir, "b", "partition")
        wait_until(lambda: _pair_state(base, proc, "not_replicating", False),
                   "a→b not replicating", timeout_s=60)  # fmt: skip
        during = {w: _tile(tmp_path, base, w) for w in (1400, PHONE)}
        for w in (1400, PHONE):
            chromium(tmp_path, f"--screenshot={shots / f'partition-{w}.png'}",
                     f"--window-size={w},1200", base + "/?range=15m")  # fmt: skip
        lab_fault(lab_dir, "b", "heal")
        wait_until(lambda: _pair_state(base, proc, "ok", True), "a→b recovered", timeout_s=60)
        after = {w: _tile(tmp_path, base, w) for w in (1400, PHONE)}
        for w in (1400, PHONE):
            chromium(tmp_path, f"--screenshot={shots / f'healed-{w}.png'}",
                     f"--window-size={w},1200", base + "/?range=15m")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    for w, tile in during.items():
        assert tile is not None and "sev-critical" in tile["cls"], (w, tile)
        assert any("not replicating" in f["text"].lower() for f in tile["flags"]), (w, tile)
        assert not any(f["clipped"] for f in tile["flags"]), (w, tile)
    for w, tile in after.items():
        assert tile is not None and "sev-critical" not in tile["cls"], (w, tile)
        assert re.search(r"recovered \d+ s ago", tile["text"]), (w, tile)
        assert not any(f["clipped"] for f in tile["flags"]), (w, tile)
    phone = after[PHONE]
    # On the phone the replication table keeps its link and RPO columns on screen.
    rpo = [h for h in phone["heads"] if h["text"].startswith("RPO")]
    link = [h for h in phone["heads"] if h["text"] == "link"]
    assert rpo and link and all(h["right"] <= PHONE for h in rpo + link), phone["heads"]
