"""The docs' pictures: the diagrams are drawn from code (docs_gen writes them; its test
fails when stale), and this suite draws the rest from the real thing: `replag serve`
over a two-region lab, healthy, then partitioned, then healed, photographed by headless
Chromium at 1400 and 390 px, and the lag plot of the same run from /api/v1/lag/series.
With REPLAG_WRITE_PICTURES=1 they are written into docs/img (commit them), else into a
temporary directory, so a dashboard that no longer renders fails here either way."""

from __future__ import annotations

import os
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from replag.docs_pictures import diagrams, lag_plot_svg
from replag.lab.server import free_port
from tests.helpers.browser import CHROMIUM, chromium
from tests.helpers.cli import spawn_replag
from tests.helpers.lab import LabFactory
from tests.helpers.serve_process import pair_state
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
WIDTHS = (1400, 390)
SHOTS = [f"dashboard-{state}-{w}.png" for state in ("healthy", "partitioned") for w in WIDTHS]


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def test_the_committed_pictures_are_there_at_their_sizes() -> None:
    for name in diagrams():
        assert (IMG / name).read_text().startswith("<svg"), name
    for name in SHOTS:
        width, height = png_size(IMG / name)
        assert width == int(name.rsplit("-", 1)[1].removesuffix(".png")) and height > 300, name
    assert "<path" in (IMG / "lag.svg").read_text()
    index = (ROOT / "docs" / "index.md").read_text()
    assert "img/dashboard-healthy-1400.png" in index and "img/agents.svg" in index


def _pair(base: str, proc: subprocess.Popen[Any], want: str, recovered: bool = False) -> bool:
    assert proc.poll() is None, "replag serve exited"
    return pair_state(base, "us-east", "eu-west", want, recovered)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_the_dashboard_and_lag_plot_drawn_from_a_partitioned_lab(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    from replag.config import render_config
    from replag.lab.cluster import lab_fault, lab_topology

    out = IMG if os.environ.get("REPLAG_WRITE_PICTURES") == "1" else tmp_path / "img"
    out.mkdir(parents=True, exist_ok=True)
    state = lab_factory(regions=("us-east", "eu-west"), delays_ms={"eu-west": 40})
    lab_dir = Path(state["dir"])
    config = tmp_path / "replag.toml"
    config.write_text(render_config(lab_topology(state), settings={
        "store": str(tmp_path / "s.sqlite"), "probe_interval": "1s", "count": 10, "rate": 0,
        "timeout": "1s", "replication_interval": "1s", "window": "1s"}))  # fmt: skip
    port = free_port()
    proc = spawn_replag("serve", "-c", str(config), "--port", str(port), log=tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"

    def shoot(state_name: str) -> None:
        for w in WIDTHS:
            chromium(tmp_path, f"--screenshot={out / f'dashboard-{state_name}-{w}.png'}",
                     f"--window-size={w},1100", base + "/?range=15m")  # fmt: skip

    started = time.time_ns()
    try:
        wait_until(lambda: _pair(base, proc, "ok"), "us-east→eu-west probed", timeout_s=120)
        time.sleep(5)  # a few rounds of healthy lag to draw
        shoot("healthy")
        cut = time.time_ns()
        lab_fault(lab_dir, "eu-west", "partition")
        wait_until(lambda: _pair(base, proc, "not_replicating"), "partitioned", timeout_s=60)
        shoot("partitioned")
        healed = time.time_ns()
        lab_fault(lab_dir, "eu-west", "heal")
        wait_until(lambda: _pair(base, proc, "ok", True), "recovered", timeout_s=60)
        time.sleep(5)
        since = f"{(time.time_ns() - started) // 10**9 + 2}s"
        series = httpx.get(base + "/api/v1/lag/series", timeout=10, params={
            "source": "us-east", "target": "eu-west", "since": since,
            "step": "1s"}).json()  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    points = series["points"]
    assert any(p["lost"] for p in points) and any(p["p99_ms"] for p in points)
    svg = lag_plot_svg(
        points,
        title="us-east → eu-west (40 ms one way): lag, then a partition and its heal",
        marks=[(cut, "partition"), (healed, "heal")],
    )
    (out / "lag.svg").write_text(svg)
    for name in SHOTS:
        width, _ = png_size(out / name)
        assert width == int(name.rsplit("-", 1)[1].removesuffix(".png")), name
