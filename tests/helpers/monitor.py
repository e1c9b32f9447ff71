"""MONITOR on a real server, to see which client sent which command.

A replica's MONITOR also shows what its primary's replication link applies (from
the primary's address); `writes_by_clients` leaves those out and keeps the
write commands (by the server's own COMMAND INFO flags) any other client sent,
scripts' commands included (shown as from "lua").
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading

import redis

_LINE = re.compile(r'^\+\d+\.\d+ \[\d+ (?P<client>\S+)\] "(?P<command>[^"]*)"')


class Monitor:
    """MONITOR on 127.0.0.1:`port` in a thread; `lines` collects what it prints."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.lines: list[str] = []
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self._sock.sendall(b"MONITOR\r\n")
        self._buffer = b""
        while b"\r\n" not in self._buffer:
            self._buffer += self._sock.recv(4096)
        first, _, self._buffer = self._buffer.partition(b"\r\n")
        assert first == b"+OK", first
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                data = self._sock.recv(65536)
                if not data:
                    return
                self._buffer += data
                *complete, self._buffer = self._buffer.split(b"\r\n")
                self.lines += [line.decode("utf-8", "replace") for line in complete]

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        return self.lines


def writes_by_clients(lines: list[str], client: redis.Redis, *, primary_port: int) -> list[str]:
    """The lines of write commands not applied from the primary at `primary_port`."""
    table = client.command()  # every command with its flags, as this server declares them
    writes = {str(name).lower() for name, entry in table.items() if "write" in _flags(entry)}
    out = []
    for line in lines:
        match = _LINE.match(line)
        if match is None or match["client"].endswith(f":{primary_port}"):
            continue
        if match["command"].lower() in writes:
            out.append(line)
    return out


def _flags(entry: object) -> set[str]:
    raw = entry.get("flags", []) if isinstance(entry, dict) else []
    return {f.decode() if isinstance(f, bytes) else str(f) for f in raw}
