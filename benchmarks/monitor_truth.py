"""The servers' own apply moments of probe keys, from MONITOR: a truth for probe_accuracy.py.

Redis feeds MONITOR from `call()` right after a command ran, with `gettimeofday`
to the microsecond; on a replica, the commands its primary sends go through the
same `call()`. A probe key's SET as the source ran it and as the replica ran it
are the two moments replication lag is made of, stamped by the servers
themselves on the host's one realtime clock, independent of every path replag
observes through (notifications, polls, its event loop, its clock mapping).

`MonitorTap` records one server's MONITOR stream to a file from a process of its
own (reading a busy stream in the prober's process would slow the prober), and
`apply_moments` reads the file back: each probe key's first command, in ns.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

_LINE = re.compile(rb'^\+(\d+)\.(\d{6}) \[[^\]]*\] "([^"]+)" "([^"]+)"')
_WRITES = frozenset({b"SET", b"set"})  # how replag writes a probe key (SET key value PX ttl)


class MonitorTap:
    """`MONITOR` on host:port, written raw to `path` by a child process until `stop()`."""

    def __init__(self, host: str, port: int, path: Path) -> None:
        self.path = path
        self._proc = subprocess.Popen([sys.executable, __file__, host, str(port), str(path)])
        deadline = time.monotonic() + 10
        while not (path.exists() and path.stat().st_size > 0):  # "+OK": it is listening
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"MONITOR on {host}:{port} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        time.sleep(0.2)  # the last lines are in flight
        self._proc.terminate()
        self._proc.wait()


def apply_moments(path: Path, prefix: str) -> dict[str, int]:
    """Probe key → the realtime ns at which the server ran its first SET of it (a
    replica polled for the key logs GETs before the SET arrives)."""
    moments: dict[str, int] = {}
    want = prefix.encode()
    with open(path, "rb") as fh:
        for line in fh:
            match = _LINE.match(line)
            if match is None or match.group(3) not in _WRITES:
                continue
            if not match.group(4).startswith(want):
                continue
            key = match.group(4).decode()
            if key not in moments:
                moments[key] = int(match.group(1)) * 10**9 + int(match.group(2)) * 1000
    return moments


def _tap(host: str, port: int, path: Path) -> None:
    sock = socket.create_connection((host, port))
    sock.sendall(b"MONITOR\r\n")
    with open(path, "wb", buffering=0) as out:
        while chunk := sock.recv(1 << 20):
            out.write(chunk)


if __name__ == "__main__":
    _tap(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
