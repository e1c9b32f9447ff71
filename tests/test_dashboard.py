"""The dashboard in headless Chromium: the matrix and the charts render from real API data."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from replag.lab.server import free_port
from replag.store import Store
from tests.lag_windows import add_windows

CHROMIUM = next(
    (p for p in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
     if p and os.path.exists(p)),
    None,
)  # fmt: skip
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


@pytest.fixture
def dashboard_url(tmp_path: Path) -> Iterator[str]:
    store = Store(tmp_path / "s.sqlite")
    add_windows(store, pairs=[("us-east", "us-west", 35.0), ("us-east", "eu-west", 160.0),
                              ("us-west", "eu-west", 520.0)], minutes=90)  # fmt: skip
    store.close()
    config = tmp_path / "replag.toml"
    config.write_text(
        f'[settings]\nstore = "{tmp_path / "s.sqlite"}"\n\n'
        '[[alerts.rules]]\nname = "slow"\nkind = "lag_p99"\nthreshold = "100ms"\n'
        + "".join(f'[[regions]]\nname = "{r}"\nreplicas = ["redis://127.0.0.1:{i + 1}"]\n'
                  for i, r in enumerate(("us-east", "us-west", "eu-west")))
    )  # fmt: skip
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "replag", "serve", "-c", str(config), "--port", str(port),
         "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                if httpx.get(url + "api/v1/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def chromium(tmp_path: Path, *args: str) -> str:
    assert CHROMIUM is not None
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium'}",
        "--virtual-time-budget=8000", "--window-size=1400,1500",
    ]  # fmt: skip
    done = subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=90)
    return done.stdout


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
    # The screenshot is for a person to look at; see docs/service.md.
    shot = tmp_path / "dashboard.png"
    chromium(tmp_path, f"--screenshot={shot}", dashboard_url)
    assert shot.stat().st_size > 20_000
    if os.environ.get("REPLAG_SCREENSHOT"):
        shutil.copy(shot, os.environ["REPLAG_SCREENSHOT"])
