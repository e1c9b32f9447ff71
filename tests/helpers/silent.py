"""Hosts that never answer: listening sockets whose connections are accepted and then left
unread and unanswered (a stopped server, a SYN-dropping firewall as far as a request's
deadline goes), and the most connections that were open on them at once.

`peak` is what tells one-by-one from in-parallel without a clock: contacted one by one,
never more than one connection is open at a time; contacted at once, as many as were.
`DroppingHosts` is the other kind: a listener whose accept queue is full, so the kernel
drops every further SYN and a connect waits for its timeout.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class SilentHosts:
    """`count` listeners on `host`, each at its own port (`ports`); or one on each of
    `hosts` (loopback addresses: 127.0.0.2, ...)."""

    def __init__(
        self, count: int = 0, *, host: str = "127.0.0.1", hosts: list[str] | None = None
    ) -> None:
        self.host = host
        self.hosts = hosts if hosts is not None else [host] * count
        self._listeners = []
        for each in self.hosts:
            listener = socket.create_server((each, 0), backlog=128)
            listener.setblocking(False)
            self._listeners.append(listener)
        self.ports = [int(s.getsockname()[1]) for s in self._listeners]
        self.open = 0
        self.peak = 0
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def addresses(self) -> list[str]:
        return [f"{h}:{port}" for h, port in zip(self.hosts, self.ports, strict=True)]

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for listener in self._listeners:
                selector.register(listener, selectors.EVENT_READ, None)
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if key.data is None:  # a listener: a new connection
                        try:
                            conn, _ = sock.accept()
                        except BlockingIOError:
                            continue
                        conn.setblocking(False)
                        selector.register(conn, selectors.EVENT_READ, "conn")
                        self.open += 1
                        self.accepted += 1
                        self.peak = max(self.peak, self.open)
                        continue
                    try:
                        data = sock.recv(65536)  # read and never answered
                    except BlockingIOError:
                        continue
                    except ConnectionError:
                        data = b""
                    if not data:  # the client gave up and closed
                        selector.unregister(sock)
                        sock.close()
                        self.open -= 1
            for key in list(selector.get_map().values()):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                sock.close()

    def __enter__(self) -> SilentHosts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class DroppingHosts(SilentHosts):
    """As `SilentHosts`, but no connection is ever made: each listener's accept queue
    (backlog 0) is filled and never accepted, so the kernel drops every further SYN and a
    connect waits for its timeout (`peak` and `accepted` stay 0)."""

    def __init__(
        self, count: int = 0, *, host: str = "127.0.0.1", hosts: list[str] | None = None
    ) -> None:
        self.host = host
        self.hosts = hosts if hosts is not None else [host] * count
        self._listeners = [socket.create_server((h, 0), backlog=0) for h in self.hosts]
        self.ports = [int(s.getsockname()[1]) for s in self._listeners]
        self.open = self.peak = self.accepted = 0
        self._fillers: list[socket.socket] = []

    def __enter__(self) -> DroppingHosts:
        for host, port in zip(self.hosts, self.ports, strict=True):
            for _ in range(2):
                filler = socket.socket()
                filler.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    filler.connect((host, port))
                self._fillers.append(filler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sock in [*self._fillers, *self._listeners]:
            sock.close()
