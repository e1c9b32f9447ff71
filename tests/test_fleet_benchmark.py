"""benchmarks/fleet.py --smoke runs (a benchmark must not rot): one group on one instance,
and PostgreSQL stopped for a few seconds under three instances, printing its lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.postgres import NO_POSTGRES, postgres_available

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not postgres_available(), reason=NO_POSTGRES)
@pytest.mark.timeout(300)
def test_fleet_benchmark_smoke() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fleet.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("fleet: 1 groups, 1 instances:") for line in lines), lines
    outage = [line for line in lines if line.startswith("store outage:")]
    assert outage and "probe runs made during the outage" in outage[0], lines
