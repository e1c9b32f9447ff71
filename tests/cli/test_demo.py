"""The README's main job, as a new user runs it: `replag demo` (and `python -m replag`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from replag.lab.server import pid_alive
from tests.helpers.cli import run_replag


def test_demo_probes_three_regions_and_leaves_nothing_running(tmp_path: Path) -> None:
    # The demo's lab lives under TMPDIR: our own one, so that demos other people run on
    # this machine at the same time are not counted as our leftovers.
    result = run_replag("demo", "--count", "60", timeout=120, env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {
        line.split()[0]: line.split()
        for line in result.stdout.splitlines()
        if line.split() and line.split()[0] in ("us-east", "us-west", "eu-west")
    }
    assert set(rows) == {"us-east", "us-west", "eu-west"}
    # columns: target replica via sent seen lost mean p50 …
    assert all(row[3] == row[4] == "60" and row[5] == "0" for row in rows.values())
    assert 38 <= float(rows["us-west"][7]) <= 60 and 78 <= float(rows["eu-west"][7]) <= 100
    assert "lab stopped" in result.stdout
    leftovers = subprocess.run(
        ["pgrep", "-f", f"{tmp_path}/replag-demo-"], capture_output=True, text=True
    )
    assert [p for p in leftovers.stdout.split() if pid_alive(int(p))] == []
