"""Hostile fake servers: a real TCP server that answers a command the way a broken or
malicious peer would, alone or as a proxy in front of a real redis-server that turns
hostile on one command only (`on_command`: every other command is relayed).

Behaviours (`HOSTILE`): `bulk` announces $10^12 and streams, `array` announces
*2^31 and streams elements, `nested` nests arrays without end, `drip` sends a reply
one byte every `drip_s`, `http` answers HTTP, `close` hangs up in the middle of a reply.
Each streams for at most `stream_s` seconds, then closes. Not in the matrix: `fat` answers
with a valid bulk of `FAT_BYTES` (400 MB, under max_reply_bytes: each such reply passes
the guard alone), the poll MGET or the scan MGET a hostile replica answers with.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import hiredis

from tests.helpers.scripted import array, bulk

HOSTILE = ("bulk", "array", "nested", "drip", "http", "close")
FAT_BYTES = 400_000_000
_CHUNK = 1 << 16


def behave(sock: socket.socket, behaviour: str, *, stream_s: float, drip_s: float) -> None:
    """Answer on `sock` as `behaviour` says, for at most `stream_s` seconds."""
    until = time.monotonic() + stream_s
    try:
        if behaviour == "bulk":
            sock.sendall(b"$1000000000000\r\n")
            _stream(sock, b"x" * _CHUNK, until)
        elif behaviour == "array":
            sock.sendall(b"*2147483648\r\n")
            _stream(sock, b":1\r\n" * (_CHUNK // 4), until)
        elif behaviour == "fat":
            sock.sendall(b"$%d\r\n" % FAT_BYTES)
            chunk, sent = b"x" * _CHUNK, 0
            while sent < FAT_BYTES and time.monotonic() < until:
                sock.sendall(chunk[: FAT_BYTES - sent])
                sent += min(_CHUNK, FAT_BYTES - sent)
            sock.sendall(b"\r\n")
        elif behaviour == "nested":
            _stream(sock, b"*1\r\n" * (_CHUNK // 4), until)
        elif behaviour == "drip":
            for byte in b"$40\r\n" + b"d" * 40 + b"\r\n":
                if time.monotonic() > until:
                    break
                sock.sendall(bytes([byte]))
                time.sleep(drip_s)
        elif behaviour == "http":
            sock.sendall(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"
                b"Content-Length: 11\r\nConnection: close\r\n\r\nBad Request"
            )
        elif behaviour == "close":
            sock.sendall(b"*3\r\n$3\r\nfoo\r\n$3\r\nba")
        else:
            raise ValueError(behaviour)
    except OSError:
        pass  # the client gave up: what a bounded client does


def _stream(sock: socket.socket, chunk: bytes, until: float) -> None:
    while time.monotonic() < until:
        sock.sendall(chunk)


class HostileServer:
    """Listening on 127.0.0.1:`port`; `hits` counts the hostile answers it gave."""

    def __init__(
        self,
        behaviour: str,
        *,
        upstream: tuple[str, int] | None = None,
        on_command: bytes | None = None,
        stream_s: float = 10.0,
        drip_s: float = 1.0,
    ) -> None:
        self.behaviour = behaviour
        self.upstream = upstream
        self.on_command = on_command.upper() if on_command else None
        self.stream_s = stream_s
        self.drip_s = drip_s
        self.hits = 0
        self.started = threading.Event()  # set when the first hostile answer begins
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._handle(self.request)

        socketserver.ThreadingTCPServer.daemon_threads = True
        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def _handle(self, client: socket.socket) -> None:
        client.settimeout(self.stream_s + 5)
        if self.upstream is None:
            self._hostile_on_first_command(client)
        else:
            self._proxy(client)

    def _hostile_on_first_command(self, client: socket.socket) -> None:
        reader = hiredis.Reader()
        while True:
            try:
                data = client.recv(_CHUNK)
            except OSError:
                return
            if not data:
                return
            reader.feed(data)
            command = reader.gets()
            if command is not False:
                break
        self.hits += 1
        self.started.set()
        behave(client, self.behaviour, stream_s=self.stream_s, drip_s=self.drip_s)

    def _proxy(self, client: socket.socket) -> None:
        assert self.upstream is not None
        try:
            server = socket.create_connection(self.upstream, timeout=self.stream_s + 5)
        except OSError:
            return
        relaying = threading.Event()
        relaying.set()

        def replies() -> None:
            try:
                while relaying.is_set() and (data := server.recv(_CHUNK)):
                    if relaying.is_set():
                        client.sendall(data)
            except OSError:
                pass

        back = threading.Thread(target=replies, daemon=True)
        back.start()
        reader = hiredis.Reader()
        try:
            while data := client.recv(_CHUNK):
                reader.feed(data)
                while (command := reader.gets()) is not False:
                    if self.on_command is None or command[0].upper() != self.on_command:
                        server.sendall(hiredis.pack_command(tuple(command)))
                        continue
                    time.sleep(0.05)  # earlier replies reach the client first
                    relaying.clear()
                    self.hits += 1
                    self.started.set()
                    behave(client, self.behaviour, stream_s=self.stream_s, drip_s=self.drip_s)
                    return
        except OSError:
            pass
        finally:
            relaying.clear()
            server.close()

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@contextmanager
def hostile_server(behaviour: str, **options: object) -> Iterator[HostileServer]:
    with HostileServer(behaviour, **options) as server:  # type: ignore[arg-type]
        yield server


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _status_kb(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class MemoryWatch:
    """Samples a process tree from /proc until stopped: per process, its resident size
    when `marked` was set (the hostile bytes start; or when first seen after) and its
    peak (VmHWM)."""

    def __init__(self, pid: int, marked: threading.Event, every_s: float = 0.02) -> None:
        self.pid = pid
        self.every_s = every_s
        self.marked = marked
        self.idle_kb: dict[int, int] = {}
        self._before_kb: dict[int, int] = {}
        self.peak_kb: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree(self) -> list[int]:
        seen, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            seen.append(pid)
            todo += _children(pid)
        return seen

    def _sample(self) -> None:
        for pid in self._tree():
            peak = _status_kb(pid, "VmHWM")
            if peak is None:
                continue
            self.peak_kb[pid] = max(peak, self.peak_kb.get(pid, 0))
            if not self.marked.is_set():
                # Its size just before: what it is compared to if it ends before the next look.
                self._before_kb[pid] = _status_kb(pid, "VmRSS") or peak
            elif pid not in self.idle_kb:
                self.idle_kb[pid] = _status_kb(pid, "VmRSS") or peak

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.every_s)

    def growth_mb(self) -> dict[int, float]:
        """Per process seen once `marked`: peak minus its size then, in MB (a process gone
        before it was seen after the mark: minus its size at the last look before)."""
        idle = {**self._before_kb, **self.idle_kb} if self.marked.is_set() else {}
        return {pid: (self.peak_kb[pid] - kb) / 1024 for pid, kb in idle.items()}

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def liar_answers(keys: int, *, strlen: int = 1) -> dict[str, object]:
    """A server of `keys` keys (SCAN pages of 100) that announces $10^12 for every MGET,
    while STRLEN says each value is `strlen` bytes (GETRANGE answers full pages, of at
    most a megabyte)."""

    def scan(command: list[bytes]) -> bytes:
        cursor, pages = int(command[1]), max(1, keys // 100)
        after = b"0" if cursor + 1 >= pages else b"%d" % (cursor + 1)
        return array(bulk(after), array(*[bulk(f"k{cursor}-{i}") for i in range(min(keys, 100))]))

    def getrange(command: list[bytes]) -> bytes:
        end = min(int(command[3]), strlen - 1, 1 << 20)  # full pages, as STRLEN claimed
        return bulk(b"x" * max(0, end - int(command[2]) + 1))

    return {
        "SCAN": scan,
        "DBSIZE": b":%d\r\n" % keys,
        "INFO": bulk("# Keyspace\r\ndb0:keys=1,expires=0,avg_ttl=0\r\n"),
        "MGET": b"$1000000000000\r\n",
        "STRLEN": b":%d\r\n" % strlen,
        "PTTL": b":-1\r\n",
        "TYPE": b"+string\r\n",
        "GETRANGE": getrange,
    }
