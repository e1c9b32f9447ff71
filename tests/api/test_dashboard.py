"""The dashboard in headless Chromium: the matrix and the charts render from real API data."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from replag.lab.server import free_port
from replag.monitoring.dynomite_figures import parse_info
from replag.monitoring.dynomite_stats import record_stats
from replag.replication import history
from replag.replication.state import PrimaryState, ReplicaState, ReplicationSnapshot
from replag.store import Store
from tests.helpers.browser import CHROMIUM, chromium
from tests.helpers.cli import spawn_replag
from tests.helpers.dynomite_admin import fixture_bytes
from tests.helpers.lag_windows import add_windows
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


@pytest.fixture
def dashboard_url(tmp_path: Path) -> Iterator[str]:
    yield from serve_dashboard(tmp_path)


@pytest.fixture
def dynomite_dashboard_url(tmp_path: Path) -> Iterator[str]:
    """Two stored /info samples of three nodes (node 2 dropped requests in between); the
    nodes' stats ports are closed now, so the service's own collection reports errors."""
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(3)]
    store = Store(tmp_path / "s.sqlite")
    now = time.time_ns()
    for age_s, extra in ((20, 0), (10, 12)):
        samples = []
        for i, url in enumerate(urls):
            info = json.loads(fixture_bytes(f"3rack_node{i + 1}_{22222 + 10 * i}_info.json"))
            if i == 1:
                info["dyn_o_mite"]["peer_dropped_requests"] += extra
                info["dyn_o_mite"]["peer_timedout_requests"] += extra // 2
            samples.append(parse_info(info, node=url, sampled_ns=now - age_s * 10**9))
        record_stats(store, samples)
    store.close()
    yield from serve_dashboard(tmp_path, f"dynomite_stats_urls = {json.dumps(urls)}\n")


def serve_dashboard(
    tmp_path: Path, settings: str = "", rules: str = "", clusters: dict[str, str] | None = None
) -> Iterator[str]:
    """`clusters`: region → the cluster it names (none without)."""
    clusters = clusters or {}
    store = Store(tmp_path / "s.sqlite")
    add_windows(store, pairs=[("us-east", "us-west", 35.0), ("us-east", "eu-west", 160.0),
                              ("us-west", "eu-west", 520.0)], minutes=90)  # fmt: skip
    store.close()
    config = tmp_path / "replag.toml"
    config.write_text(
        f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\n{settings}\n'
        '[[alerts.rules]]\nname = "slow"\nkind = "lag_p99"\nthreshold = "100ms"\n' + rules
        + "".join(f'[[regions]]\nname = "{r}"\nreplicas = ["redis://127.0.0.1:{i + 1}"]\n'
                  + (f'cluster = "{clusters[r]}"\n' if r in clusters else "")
                  for i, r in enumerate(("us-east", "us-west", "eu-west")))
    )  # fmt: skip
    port = free_port()
    log = tmp_path / "serve.log"
    proc = spawn_replag(
        "serve", "-c", str(config), "--port", str(port), "--log-level", "warning", log=log
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        # A starved 2-core machine can take long to start the app: the deadline only bounds a hang.
        wait_until(
            lambda: _healthy(url, proc, log), f"replag serve answering on {url}", timeout_s=120
        )
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    """True once the dashboard answers; fails at once, with its stderr, if the server died."""
    if proc.poll() is not None:
        raise AssertionError(f"replag serve exited {proc.returncode}: {log.read_text()}")
    try:
        return httpx.get(url + "api/v1/health").status_code == 200
    except httpx.TransportError:
        return False


def test_matrix_and_charts_render_with_data(dashboard_url: str, tmp_path: Path) -> None:
    dom = chromium(tmp_path, "--dump-dom", dashboard_url)
    assert 'data-loaded="true"' in dom
    cells = re.findall(r'class="cell sev-(\w+)" data-source="([^"]+)" data-target="([^"]+)" '
                       r'data-p99="([\d.]+)"', dom)  # fmt: skip
    severity = {(s, t): sev for sev, s, t, _ in cells}
    assert severity == {("us-east", "us-west"): "ok", ("us-east", "eu-west"): "warning",
                        ("us-west", "eu-west"): "critical"}  # fmt: skip
    charts = re.findall(r'<svg class="chart"[^>]*data-points="(\d+)"', dom)
    assert len(charts) == 3 and all(int(n) > 10 for n in charts)
    lines = re.findall(r'class="line-p99" d="M([\d.]+),([\d.]+)((?:L[\d.]+,[\d.]+)+)"', dom)
    assert len(lines) == 3
    assert '<section class="card" id="dynomite-card" hidden=""' in dom  # no Dynomite: no panel
    # Every figure carries its unit, once: the y axes say ms or s, tiles and read-outs too.
    y_labels = re.findall(r'<text class="axis" [^>]*text-anchor="end"[^>]*>([^<]+)</text>', dom)
    assert y_labels and all(re.fullmatch(r"\d+(\.\d+)? (ms|s)|loss", t) for t in y_labels), y_labels
    assert " s ms" not in dom and "ms ms" not in dom
    assert re.search(r'<div class="p99">1\d\d\.\d<span class="unit">ms</span>', dom)
    # The screenshot is for a person to look at; see the README, "Dashboard".
    shot = tmp_path / "dashboard.png"
    chromium(tmp_path, f"--screenshot={shot}", dashboard_url)
    assert shot.stat().st_size > 20_000
    if os.environ.get("REPLAG_SCREENSHOT"):
        shutil.copy(shot, os.environ["REPLAG_SCREENSHOT"])


def test_a_cluster_picker_when_regions_name_several_clusters(tmp_path: Path) -> None:
    """Regions of two clusters: the picker lists them; ?cluster=west keeps west's sources."""
    clusters = {"us-east": "east", "us-west": "west", "eu-west": "west"}
    served = serve_dashboard(tmp_path, clusters=clusters)
    url = next(served)
    try:
        dom = chromium(tmp_path, "--dump-dom", url + "?cluster=west")
    finally:
        served.close()
    assert 'data-loaded="true"' in dom
    picker = re.search(r'<select id="cluster"[^>]*>(.*?)</select>', dom)
    assert picker is not None and "hidden" not in picker.group(0).split(">")[0]
    assert re.findall(r'<option value="([^"]*)"', picker.group(1)) == ["", "east", "west"]
    sources = set(re.findall(r'class="cell sev-\w+" data-source="([^"]+)"', dom))
    assert sources == {"us-west"}


def test_charts_span_the_range_picked(dashboard_url: str, tmp_path: Path) -> None:
    """90 minutes of data in a 24 h range: the lines start near the right edge, the axis
    covers the day, and p99 and p50 stay one line each (windows a minute apart join up)."""
    dom = chromium(tmp_path, "--dump-dom", dashboard_url + "?range=24h")
    assert 'data-loaded="true"' in dom
    widths = [float(w) for w in re.findall(r'<svg class="chart" width="(\d+)"', dom)]
    starts = [float(x) for x in re.findall(r'class="line-p99" d="M([\d.]+),', dom)]
    assert len(starts) == 3 and all(x / w > 0.85 for x, w in zip(starts, widths, strict=True))
    assert all(d.count("M") == 1 for d in re.findall(r'class="line-p99" d="([^"]+)"', dom))


def test_dynomite_panel_shows_each_node_and_the_one_dropping(
    dynomite_dashboard_url: str, tmp_path: Path
) -> None:
    dom = chromium(tmp_path, "--dump-dom", dynomite_dashboard_url)
    assert 'data-loaded="true"' in dom and 'id="dynomite-card" hidden' not in dom
    dropped = dict(re.findall(r'<tr data-node="([^"]+)" data-dropped="(\d+)">', dom))
    assert sorted(dropped.values()) == ["0", "0", "12"]
    assert dom.count("writes were dropped; replicas may have diverged: run repair") == 1
    assert dom.count('class="badge badge-failed">unreachable<') == 3  # the ports are closed now
    assert "217 µs" in dom  # node 1's cross-zone p99
    shot = tmp_path / "dynomite.png"
    chromium(tmp_path, f"--screenshot={shot}", dynomite_dashboard_url)
    if os.environ.get("REPLAG_SCREENSHOT"):
        shutil.copy(shot, os.environ["REPLAG_SCREENSHOT"].replace(".png", "-dynomite.png"))


def record_replication(tmp_path: Path) -> None:
    """Two replication samples of us-east's primary: us-west-1 cut off and falling behind."""
    store = Store(tmp_path / "s.sqlite")
    now = time.time_ns()
    for age_s, behind in ((60, 1024), (5, 2048)):
        replicas = (
            ReplicaState(replica="us-west-1", region="us-west", address="", status="link-down",
                         link_down_s=age_s, bytes_behind=behind, bytes_uncertainty=0,
                         backlog_headroom=16384 - behind,
                         headroom_fraction=(16384 - behind) / 16384),
            ReplicaState(replica="eu-west-1", region="eu-west", address="", status="ok",
                         bytes_behind=0, bytes_uncertainty=0, backlog_headroom=16384,
                         headroom_fraction=1.0, priority=100),
        )  # fmt: skip
        primary = PrimaryState(source="us-east", primary="us-east-primary", address="",
                               sampled_ns=now - age_s * 10**9, offset=5000, backlog_size=16384,
                               sync_full=1, replicas=replicas)  # fmt: skip
        history.record_snapshot(store, ReplicationSnapshot(primaries=[primary]))
    store.close()


@pytest.fixture
def replication_dashboard_url(tmp_path: Path) -> Iterator[str]:
    record_replication(tmp_path)
    yield from serve_dashboard(tmp_path)


def test_replication_beside_the_lag_tiles_and_in_its_panel(
    replication_dashboard_url: str, tmp_path: Path
) -> None:
    dom = chromium(tmp_path, "--dump-dom", replication_dashboard_url)
    assert 'data-loaded="true"' in dom and 'id="replication-card" hidden' not in dom
    # The lag tile us-east → us-west says how far behind its replica is now.
    tile = r'class="repl repl-down" data-bytes-behind="2048"[^>]*><div>2\.0 KiB behind</div>'
    assert re.search(tile + r"<div>headroom 88% · link down</div>", dom)
    rows = dict(re.findall(r'<tr data-replica="([^"]+)" data-status="([^"]+)"', dom))
    assert rows == {"us-west-1": "link-down", "eu-west-1": "ok"}
    assert "safest failover: eu-west-1 (loses 0 B)" in dom
    sparks = re.findall(r'<svg class="spark"[^>]*data-points="(\d+)"', dom)
    assert sorted(sparks) == ["2", "2"]
    assert "peak 2.0 KiB" in dom and "peak 0 B" in dom  # the sparkline's scale, in words
    # Headroom bars: 88 % and 100 % left are healthy (green), not a warning colour.
    assert re.findall(r'class="fill (fill-\w+)"', dom) == ["fill-ok", "fill-ok"]
    shot = tmp_path / "replication.png"
    chromium(tmp_path, f"--screenshot={shot}", replication_dashboard_url)
    if os.environ.get("REPLAG_SCREENSHOT"):
        shutil.copy(shot, os.environ["REPLAG_SCREENSHOT"].replace(".png", "-replication.png"))


def test_headroom_bars_take_the_colours_of_the_headroom_rules(tmp_path: Path) -> None:
    """A critical rule at 90 % for us-west: its replica's 88 % left is red, in its bar and
    in the lag tile; eu-west's replica (100 %, no rule of its own) stays green."""
    record_replication(tmp_path)
    rule = (
        '[[alerts.rules]]\nname = "west-headroom"\nkind = "replication_headroom"\n'
        'threshold = 0.9\ntarget = "us-west"\nseverity = "critical"\n'
    )
    for url in serve_dashboard(tmp_path, rules=rule):
        dom = chromium(tmp_path, "--dump-dom", url)
        assert 'data-loaded="true"' in dom
        bars = dict(re.findall(r'<tr data-replica="([^"]+)".*?class="fill (fill-\w+)"', dom))
        assert bars == {"us-west-1": "fill-low", "eu-west-1": "fill-ok"}
        assert 'class="repl repl-down repl-low" data-bytes-behind="2048"' in dom
        assert "red under 90%" in dom


def test_a_silent_replica_is_red_in_its_regions_tile_and_has_its_own_chart(
    tmp_path: Path,
) -> None:
    """eu-west has three replicas; eu-west-3 sees none of us-east's probes. The region
    loses a third of them (amber by the loss bands alone), but the tile is red and says
    which replica: one row per replica, each in its own colour, and a chart each."""
    store = Store(tmp_path / "s.sqlite")
    for name in ("eu-west-2", "eu-west-3"):
        add_windows(store, pairs=[("us-east", "eu-west", 160.0)], minutes=90, replica=name,
                    silent=name == "eu-west-3")  # fmt: skip
    store.close()
    for url in serve_dashboard(tmp_path):
        dom = chromium(tmp_path, "--dump-dom", url)
        assert 'data-loaded="true"' in dom
        assert re.search(r'class="cell sev-critical" data-source="us-east" data-target="eu-west"',
                         dom)  # fmt: skip
        rows = {name: sev for sev, name in re.findall(
            r'class="replica-row sev-(\w+)[^"]*" data-replica="([^"]+)"', dom)}  # fmt: skip
        assert rows == {"eu-west-1": "warning", "eu-west-2": "warning", "eu-west-3": "critical"}
        charts = re.findall(r'class="chart-card[^"]*" data-pair="([^"]+)"', dom)
        assert {c for c in charts if "/" in c} == {
            f"us-east→eu-west/eu-west-{i}" for i in (1, 2, 3)
        }
        assert len(charts) == 3 + 3
        assert "no probe seen: 100% lost" in dom  # eu-west-3's chart is dark throughout
        if os.environ.get("REPLAG_SCREENSHOT"):
            shot = tmp_path / "replicas.png"
            chromium(tmp_path, f"--screenshot={shot}", url)
            shutil.copy(shot, os.environ["REPLAG_SCREENSHOT"].replace(".png", "-replicas.png"))
