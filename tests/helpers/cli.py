"""`python -m replag` in a subprocess, as a user runs it: the one way tests start the CLI.

- `run_replag(*args)`: run to its end, stdout and stderr captured as text, the exit code
  left to the test (`CompletedProcess`);
- `spawn_replag(*args, log=…)`: start it (`serve`, `agent`, a long `repair run`), its
  stdout and stderr appended to `log`, a file the test keeps and that is shown when it
  fails (`tests.helpers.process_logs`);
- `replag_argv(*args)`: the command line, for a runner of one's own (a terminal, a
  sampler of memory, a pipe read line by line).

The child imports replag from this checkout whatever directory it starts in
(`PYTHONPATH` leads with it) and writes its output unbuffered; `env` adds variables to
this process's environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.helpers import process_logs

ROOT = Path(__file__).resolve().parents[2]


def replag_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "replag", *args]


def replag_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with `env` over it, replag imported from this checkout."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **(env or {})}


def run_replag(
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    input: str | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`replag ARGS` to its end (at most `timeout` s), its output captured as text."""
    return subprocess.run(
        replag_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        cwd=cwd,
        env=replag_env(env),
        check=False,
    )


def spawn_replag(
    *args: str, log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`replag ARGS` started, stdout and stderr appended to `log` (the caller stops it)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    process_logs.keep(log)
    with log.open("ab") as out:
        return subprocess.Popen(
            replag_argv(*args),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=replag_env(env),
        )
