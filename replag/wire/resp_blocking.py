"""A blocking RESP connection: one socket, no event loop, for a process that only scans.

A scan process does nothing but read one replica as fast as it answers, so
asyncio's machinery (transports, futures, callbacks) and the kernel receive
stamps of `RespConnection` are pure overhead there: this connection writes
with `sendall` and reads replies one at a time through hiredis. It opens the
way `RespConnection` does (TLS with the endpoint's own context, then the same AUTH
and SELECT: `setup_commands`), and fails the same way: every socket error,
timeout (each read or write waits at most `timeout_s`), error reply or
non-RESP answer is one `EndpointError` naming the endpoint.
"""

from __future__ import annotations

import socket
import time
from itertools import islice
from typing import Any

import hiredis

from replag.errors import EndpointError
from replag.topology import Endpoint
from replag.wire import shapes
from replag.wire.connections import not_resp, server_name, tls_context, translate
from replag.wire.held import HeldBytes
from replag.wire.reply_limits import NotRespHeader, ReplyGuard, ReplyLimitError, command_name
from replag.wire.resp import check_replies, setup_commands

_READ_SIZE = 1 << 18  # per connection: a scan process holds one per replica it reads
# What hiredis answers while no whole reply is buffered (its default, False, equals the
# integer reply 0, so it could not end an `iter`).
_INCOMPLETE = object()


class BlockingConnection:
    """One TCP (or TLS) connection to `endpoint`, authenticated and on the right db."""

    def __init__(self, endpoint: Endpoint, sock: socket.socket, timeout_s: float) -> None:
        self.endpoint = endpoint
        self._sock = sock
        self._timeout_s = timeout_s
        self._deadline = 0.0  # of the exchange under way (time.monotonic)
        self._sent = b""  # the start of the last request, to name its command
        self._reader = hiredis.Reader(notEnoughData=_INCOMPLETE)
        self._guard = ReplyGuard(endpoint.limits)
        self._held = HeldBytes(endpoint)  # this connection's share of its server's bytes
        self._first_bytes = b""
        self._buffer = bytearray(_READ_SIZE)
        self.bytes_received = 0
        # A reply broke a reply limit (the connection is then unusable): the scan re-reads
        # what that reply held in smaller pieces on a new connection. The command refused.
        self.refused: str | None = None

    @classmethod
    def open(cls, endpoint: Endpoint, *, timeout_s: float) -> BlockingConnection:
        context = tls_context(endpoint)
        try:
            sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
        except OSError as exc:  # TimeoutError included
            raise translate(exc, endpoint) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=server_name(endpoint))
        except OSError as exc:  # ssl.SSLError included
            sock.close()
            raise translate(exc, endpoint) from exc
        conn = cls(endpoint, sock, timeout_s)
        try:
            setup = setup_commands(endpoint)
            if setup:
                check_replies(conn.request(b"".join(setup), len(setup)), endpoint)
        except BaseException:
            conn.close()  # a refused AUTH must not leave the socket open
            raise
        return conn

    def send(self, payload: bytes) -> None:
        self._sent = payload[:64]
        try:
            self._sock.settimeout(self._timeout_s)
            self._sock.sendall(payload)
        except OSError as exc:
            raise translate(exc, self.endpoint) from exc

    def reply(self) -> Any:
        """The next reply (an error reply is returned, as hiredis makes it)."""
        self._deadline = time.monotonic() + self._timeout_s
        gets = self._reader.gets
        try:
            while (item := gets()) is _INCOMPLETE:
                self._feed()
        except hiredis.ProtocolError:
            raise translate(not_resp(self._first_bytes), self.endpoint) from None
        self._held.release()
        return item

    def replies(self, count: int) -> list[Any]:
        """The next `count` replies. Taken from hiredis in C (`islice` over `iter`), not
        one Python call each: a batch's pipelined PTTLs are a reply per key."""
        out: list[Any] = []
        self._deadline = time.monotonic() + self._timeout_s
        gets = self._reader.gets
        try:
            while True:
                out += islice(iter(gets, _INCOMPLETE), count - len(out))
                if len(out) == count:
                    self._held.release()
                    return out
                self._feed()
        except hiredis.ProtocolError:
            raise translate(not_resp(self._first_bytes), self.endpoint) from None

    def request(self, payload: bytes, count: int) -> list[Any]:
        """`payload`'s `count` replies, each checked against its command's shape (a small
        request's; a scan batch's are checked as a batch, `shapes.check_batch`)."""
        self.send(payload)
        replies = self.replies(count)
        shapes.check_request(self.endpoint, payload, replies)
        return replies

    def check(self, replies: list[Any]) -> None:
        check_replies(replies, self.endpoint)

    def _feed(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise translate(self._late(), self.endpoint)
        try:
            self._sock.settimeout(left)
            # Into one buffer, reused: a fresh megabyte per read costs page faults.
            size = self._sock.recv_into(self._buffer)
        except TimeoutError:
            raise translate(self._late(), self.endpoint) from None
        except OSError as exc:
            raise translate(exc, self.endpoint) from exc
        if not size:
            closed = ConnectionResetError("connection closed by the server")
            raise translate(closed, self.endpoint)
        if not self._first_bytes:
            self._first_bytes = bytes(self._buffer[: min(size, 48)])
        self.bytes_received += size
        try:
            self._guard.feed(self._buffer, size)
            self._held.add(size)
        except ReplyLimitError as exc:
            self.refused = command_name(self._sent)
            refused = ReplyLimitError(f"reply to {self.refused} refused: {exc}")
            raise translate(refused, self.endpoint) from None
        except NotRespHeader as exc:
            # Named by the bytes where a reply should begin (not the connection's first).
            raise translate(not_resp(exc.args[0]), self.endpoint) from None
        self._reader.feed(self._buffer, 0, size)  # type: ignore[arg-type]  # any buffer

    def _late(self) -> TimeoutError:
        return TimeoutError(
            f"no whole reply to {command_name(self._sent)} within {self._timeout_s:g}s "
            "(the server stalls or sends too slowly)"
        )

    def close(self) -> None:
        self._held.release()
        self._sock.close()


__all__ = ["BlockingConnection", "EndpointError"]
