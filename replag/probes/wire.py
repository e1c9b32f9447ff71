"""A minimal RESP connection that timestamps bytes at the socket, for probe writes and polls.

redis-py spends tens of microseconds encoding before the send and parsing
after the receive; on loopback that is more than the network round trip, and
it is not symmetric, so a midpoint built from library-level times is biased.
Here `t_sent` is taken just before the transport write and `t_recv` when the
reply's bytes arrive, before parsing.
"""

from __future__ import annotations

import asyncio
import collections
import ssl as ssl_module
import time
from typing import Any

import hiredis

from replag.errors import AuthError, EndpointError, UnreachableError
from replag.topology import Endpoint


def encode(*parts: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        raw = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[asyncio.Future[tuple[Any, int]]] = collections.deque()
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        self.reader.feed(data)
        while self.waiting:
            reply = self.reader.gets()
            if reply is False:
                return
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_result((reply, now))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("connection closed by the server")
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(self.lost)


class RespConnection:
    """One connection, replies matched in order; `call` returns (reply, t_sent, t_recv)."""

    def __init__(self, endpoint: Endpoint, *, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._protocol: _Protocol | None = None

    @property
    def where(self) -> str:
        return f"{self.endpoint.name} ({self.endpoint.url()})"

    async def connect(self) -> RespConnection:
        loop = asyncio.get_running_loop()
        ssl = ssl_module.create_default_context() if self.endpoint.tls else None
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_Protocol, self.endpoint.host, self.endpoint.port, ssl=ssl),
                self.timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise UnreachableError(f"unreachable: {exc or 'timed out'}", where=self.where) from None
        self._protocol = protocol
        ep = self.endpoint
        if ep.password:
            auth = ("AUTH", ep.username, ep.password) if ep.username else ("AUTH", ep.password)
            reply, _, _ = await self.call(*auth)
            if isinstance(reply, hiredis.ReplyError):
                raise AuthError("authentication failed", where=self.where)
        if ep.db:
            await self.checked("SELECT", ep.db)
        return self

    def send(self, *parts: bytes | str | int) -> tuple[asyncio.Future[tuple[Any, int]], int]:
        """Queue one command; its future resolves to (reply, t_recv)."""
        protocol = self._protocol
        if protocol is None or protocol.transport is None:
            raise UnreachableError("not connected", where=self.where)
        if protocol.lost is not None:
            raise UnreachableError(f"connection lost: {protocol.lost}", where=self.where)
        fut: asyncio.Future[tuple[Any, int]] = asyncio.get_running_loop().create_future()
        protocol.waiting.append(fut)
        t_sent = time.monotonic_ns()
        protocol.transport.write(encode(*parts))
        return fut, t_sent

    async def call(self, *parts: bytes | str | int) -> tuple[Any, int, int]:
        fut, t_sent = self.send(*parts)
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that races with the reply, and the observer would never stop.
            async with asyncio.timeout(self.timeout_s):
                reply, t_recv = await fut
        except TimeoutError:
            raise UnreachableError(
                f"timed out after {self.timeout_s:g}s", where=self.where
            ) from None
        except (OSError, ConnectionError) as exc:
            hint = (
                " (Dynomite closes the connection on commands it does not support)"
                if self.endpoint.kind == "dynomite"
                else ""
            )
            raise UnreachableError(f"connection lost: {exc}{hint}", where=self.where) from None
        return reply, t_sent, t_recv

    async def checked(self, *parts: bytes | str | int) -> Any:
        """`call`, raising EndpointError on an error reply."""
        reply, _, _ = await self.call(*parts)
        if isinstance(reply, hiredis.ReplyError):
            raise EndpointError(f"{parts[0]!s} failed: {reply}", where=self.where)
        return reply

    async def min_rtt_ns(self, rounds: int = 9) -> int:
        best = None
        for _ in range(rounds):
            _, t_sent, t_recv = await self.call("PING")
            best = t_recv - t_sent if best is None else min(best, t_recv - t_sent)
        assert best is not None
        return best

    def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
