"""Run a command and measure it from outside: wall, CPU, peak RSS, bytes written to disk.

CPU and the largest single-process RSS come from `wait4` (they include the
command's own reaped children); the peak memory of the whole process tree is
the largest sum of its processes' proportional set sizes (PSS: a page shared
by a forked worker and its parent counts half to each, so nothing is counted
twice), sampled every 20 ms; disk writes
are the growth of this process's `write_bytes` in /proc/self/io, into which
the kernel folds every reaped child's (bytes dirtied for storage: sockets and
pipes are not counted).

Sampling PSS is not free: the kernel walks each process's page tables for
it. On 2 cores it slowed a 3.7 s check by 0.25 s (7%), so a benchmark that
times a run against a ceiling measured without a sampler times it with
`sample_memory=False` and takes the memory from a run of its own.
"""

from __future__ import annotations

import math
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Measured:
    seconds: float
    cpu_s: float
    tree_rss_mb: float
    max_rss_mb: float
    disk_write_mb: float
    returncode: int
    stdout: str
    stderr: str


def _written_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no write_bytes")


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                children = Path(f"/proc/{p}/task/{task}/children").read_text().split()
                todo.extend(int(c) for c in children)
        except OSError:
            continue
    return out


def _kb_field(path: str, name: str) -> int | None:
    """`name:` (a "… kB" line of a /proc file) in bytes; None if absent or unreadable."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return None


def _hwm_bytes(pid: int) -> int:
    """The process's own peak RSS (VmHWM: its address space's, begun at its exec)."""
    return _kb_field(f"/proc/{pid}/status", "VmHWM") or 0


def _rss_bytes(pid: int) -> int:
    """PSS where the kernel has smaps_rollup, else RSS."""
    pss = _kb_field(f"/proc/{pid}/smaps_rollup", "Pss")
    if pss is not None:
        return pss
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def run_measured(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    sample_memory: bool = True,
) -> Measured:
    written = _written_bytes()
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = hwm = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak, hwm
        while not stop.wait(0.02):
            pids = _tree(proc.pid)
            peak = max(peak, sum(_rss_bytes(p) for p in pids))
            hwm = max([hwm, *(_hwm_bytes(p) for p in pids)])

    sampler = threading.Thread(target=sample, daemon=True)
    if sample_memory:
        sampler.start()
    # Read the pipes ourselves and reap with wait4 to get the child's rusage.
    outputs: dict[str, str] = {}

    def drain(name: str) -> None:
        stream = getattr(proc, name)
        outputs[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n,)) for n in ("stdout", "stderr")]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    stop.set()
    if sample_memory:
        sampler.join()
    for r in readers:
        r.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Measured(
        seconds=seconds,
        cpu_s=usage.ru_utime + usage.ru_stime,
        # Not the rusage's ru_maxrss: Linux carries the forking process's high-water mark
        # across exec into it, so every child "peaked" at this benchmark's own size (a
        # `sleep` run from a 300 MB parent reads 315 MB). Only a run too short to be
        # sampled falls back to it.
        tree_rss_mb=(peak or usage.ru_maxrss * 1024) / 2**20 if sample_memory else math.nan,
        max_rss_mb=(hwm or usage.ru_maxrss * 1024) / 2**20 if sample_memory else math.nan,
        disk_write_mb=(_written_bytes() - written) / 1e6,
        returncode=proc.returncode,
        stdout=outputs.get("stdout", ""),
        stderr=outputs.get("stderr", ""),
    )
