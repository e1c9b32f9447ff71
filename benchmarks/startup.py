"""How fast `replag` starts: `--help`, and `replag probe` up to its first command to Redis.

A cron probe every minute pays the interpreter's and replag's start each
time. Measured in the same run, `--runs` times each, interleaved: `python -c
pass` (the floor: this interpreter and its site-packages), `replag --help`,
`replag probe --help`, and a real `replag probe` on a local two-region lab,
timed from the moment it is spawned to the first command any of the lab's
redis-servers receives from it (read from MONITOR, whose timestamps are on
the same wall clock). Target: ≤ 0.3 s for `replag --help` and the probe's
start. replag's modules are byte-compiled first, as `pip install` does (a
process started with PYTHONDONTWRITEBYTECODE=1 would otherwise compile every
module from source on every start).

    python benchmarks/startup.py [--runs 9]
"""

from __future__ import annotations

import argparse
import compileall
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

import replag
from replag.lab.cluster import LabSpec, lab_down, lab_up

TARGET_S = 0.3


def replag_argv() -> list[str]:
    script = shutil.which("replag")
    return [script] if script else [sys.executable, "-m", "replag"]


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


class Monitors:
    """MONITOR on every lab server: when did the first command from anyone else arrive?

    A replica's MONITOR also shows what its primary sends it (the replicated
    stream, the primary's PINGs): those come from the master link, whose address
    `CLIENT LIST TYPE master` names, and are left out."""

    def __init__(self, ports: list[int]) -> None:
        self.socks = []
        self.master_links: set[bytes] = set()
        for port in ports:
            with socket.create_connection(("127.0.0.1", port)) as admin:
                admin.sendall(b"CLIENT LIST TYPE master\r\n")
                listing = admin.recv(1 << 16)
            for field in listing.split():
                if field.startswith(b"addr="):
                    self.master_links.add(field[len(b"addr=") :])
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"MONITOR\r\n")
            if not sock.recv(64).startswith(b"+OK"):
                raise RuntimeError(f"MONITOR refused on port {port}")
            sock.setblocking(False)
            self.socks.append(sock)

    def drain(self) -> None:
        while select.select(self.socks, [], [], 0.05)[0]:
            for sock in select.select(self.socks, [], [], 0)[0]:
                sock.recv(1 << 16)

    def first_command_after(self, spawned: float, deadline_s: float) -> float:
        """Wall-clock seconds of the first command from a client (not a master link)
        seen at or after `spawned` (MONITOR lines start with the moment)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            for sock in select.select(self.socks, [], [], 0.1)[0]:
                data = sock.recv(1 << 16)
                for line in data.split(b"\r\n"):
                    if not (line.startswith(b"+") and b"[" in line):
                        continue
                    moment, _, rest = line[1:].partition(b" ")
                    client = rest[1:].split(b"]", 1)[0].split()[-1]
                    if client not in self.master_links and float(moment) >= spawned:
                        return float(moment)
        raise RuntimeError("the probe sent no command to any lab server")

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def probe_start(argv: list[str], monitors: Monitors) -> float:
    monitors.drain()
    spawned = time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        first = monitors.first_command_after(spawned, 30.0)
    finally:
        proc.wait()
    return first - spawned


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parse_args(parser, runs=1)
    command = replag_argv()
    compileall.compile_dir(Path(replag.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory(prefix="replag-bench-") as tmp:
        lab_dir = Path(tmp) / "lab"
        state = lab_up(lab_dir, LabSpec(regions=("near", "far"), delays_ms={}))
        monitors = Monitors([p["port"] for p in state["processes"] if p["kind"] == "redis-server"])
        try:
            cases = {
                "python -c pass": lambda: timed([sys.executable, "-c", "pass"]),
                "replag --help": lambda: timed([*command, "--help"]),
                "replag probe --help": lambda: timed([*command, "probe", "--help"]),
                "replag probe, to its first command": lambda: probe_start(
                    [*command, "probe", "--config", str(lab_dir / "topology.toml"), "--count", "1"],
                    monitors,
                ),
            }
            times: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(args.runs):
                for name, case in cases.items():
                    times[name].append(case())
        finally:
            monitors.close()
            lab_down(lab_dir)
    floor = statistics.median(times["python -c pass"])
    print(
        f"start-up, {args.runs} runs each, interleaved ({' '.join(command)}); "
        f"load {os.getloadavg()[0]:.2f}"
    )
    for name, values in times.items():
        median = statistics.median(values)
        verdict = ""
        if name in ("replag --help", "replag probe, to its first command"):
            verdict = f"  target ≤ {TARGET_S} s: {'met' if median <= TARGET_S else 'MISSED'}"
        print(
            f"  {name:<36} median {median * 1000:6.0f} ms  min {min(values) * 1000:6.0f} ms  "
            f"= floor + {(median - floor) * 1000:5.0f} ms{verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
