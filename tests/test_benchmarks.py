"""Every benchmark runs end to end in its `--smoke` mode, so none can rot unseen.

A benchmark is a script nothing else runs: when a default it relies on changes
(as `allow_config_changes = false` once left `agents_wan.py` waiting for ever), only
running it tells. Each runs here at tiny sizes on the same code path, in a process
of its own under a timeout; a hang, a traceback or a non-zero exit fails the suite.
The figures a smoke run prints mean nothing and are not looked at, beyond its
saying it ran as a smoke run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(
    p.name
    for p in (ROOT / "benchmarks").glob("*.py")
    if not p.name.startswith("_") and p.name != "runstats.py"  # runstats: a library
)
# A smoke run takes seconds to a minute on a quiet host (api_load, the longest, ~40 s);
# the limit leaves room for a CI host running the other worker's tests beside it.
SMOKE_TIMEOUT_S = 170


def test_every_benchmark_is_listed() -> None:
    assert "agents_wan.py" in BENCHMARKS and "check_ceiling.py" in BENCHMARKS
    assert len(BENCHMARKS) >= 15


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 10)
@pytest.mark.parametrize("script", BENCHMARKS)
def test_benchmark_smoke_run_completes(script: str, tmp_path: Path) -> None:
    # TMPDIR stays the system's: fleet.py's PostgreSQL runs as an unprivileged user, who
    # cannot enter pytest's root-only temporary directories.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / script), "--smoke"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=SMOKE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-2000:] if isinstance(exc.stdout, bytes) else exc.stdout
        pytest.fail(f"{script} --smoke still running after {SMOKE_TIMEOUT_S} s:\n{out}")
    tail = (done.stdout[-3000:] + "\n--- stderr ---\n" + done.stderr[-3000:]).strip()
    assert done.returncode == 0, f"{script} --smoke exited {done.returncode}:\n{tail}"
    assert "smoke run" in done.stdout.splitlines()[0], tail
    assert "Traceback" not in done.stderr, tail
