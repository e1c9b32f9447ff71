"""Watching probe keys arrive on one replica: push (keyspace notifications) or poll (MGET).

Each observer fills `arrivals[key] = Arrival(...)`: the estimated moment the
replica applied the key, on this process's monotonic clock, with the bracket
[lo_ns, hi_ns] that surely contains it.

Push reads the subscription socket with its own asyncio protocol and a hiredis
parser, stamping each chunk as it leaves the kernel: no client-library queue
between the wire and the timestamp. The replica publishes the event when it
applies the write, so the apply moment lies within one round trip before the
arrival; the estimate subtracts half the smallest PING round trip.

Poll sends one MGET of every outstanding key per tick; a key was applied after
the last round that missed it was evaluated and before the round that found it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import hiredis

from replag.errors import ReplagError
from replag.resp import RespConnection
from replag.topology import Endpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Arrival:
    estimate_ns: int
    lo_ns: int
    hi_ns: int

    @property
    def half_width_ns(self) -> int:
        return (self.hi_ns - self.lo_ns) // 2


class Observer:
    """Base: what the runner needs from either mode."""

    mode = "none"

    def __init__(self, replica: Endpoint) -> None:
        self.replica = replica
        self.arrivals: dict[bytes, Arrival] = {}
        self.error: str | None = None

    def expect(self, key: bytes, written_lo_ns: int) -> None:
        """A write of `key` was sent at `written_lo_ns`."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError


class _PushProtocol(asyncio.Protocol):
    def __init__(self, observer: PushObserver) -> None:
        self.observer = observer
        self.reader = hiredis.Reader()
        self.transport: asyncio.Transport | None = None
        self.replies: asyncio.Queue[object] = asyncio.Queue()
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        self.reader.feed(data)
        while True:
            try:
                msg = self.reader.gets()
            except hiredis.ProtocolError as exc:
                self.observer.error = f"protocol error on push connection: {exc}"
                if self.transport:
                    self.transport.close()
                return
            if msg is False:
                return
            if (
                isinstance(msg, list)
                and len(msg) == 4
                and msg[0] == b"pmessage"
                and msg[3] == b"set"
            ):
                self.observer.on_event(msg[2], now)
            else:
                self.replies.put_nowait(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)


def _command(*parts: bytes | str) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        raw = part.encode() if isinstance(part, str) else part
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


class PushObserver(Observer):
    mode = "push"

    def __init__(self, replica: Endpoint, *, pattern: bytes, rtt_ns: int, timeout_s: float) -> None:
        super().__init__(replica)
        self.channel_prefix = f"__keyspace@{replica.db}__:".encode()
        self.pattern = self.channel_prefix + pattern
        self.rtt_ns = rtt_ns
        self.timeout_s = timeout_s
        self.protocol: _PushProtocol | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False

    def on_event(self, channel: bytes, now_ns: int) -> None:
        key = channel[len(self.channel_prefix) :]
        if key not in self.arrivals:
            half = self.rtt_ns // 2
            self.arrivals[key] = Arrival(
                estimate_ns=now_ns - half, lo_ns=now_ns - self.rtt_ns, hi_ns=now_ns
            )

    async def _reply(self) -> object:
        assert self.protocol is not None
        return await asyncio.wait_for(self.protocol.replies.get(), self.timeout_s)

    async def start(self) -> None:
        """Subscribe (once: the runner starts every observer, push ones already are)."""
        if self.protocol is not None:
            return
        loop = asyncio.get_running_loop()
        ssl = True if self.replica.tls else None
        _, protocol = await asyncio.wait_for(
            loop.create_connection(
                lambda: _PushProtocol(self), self.replica.host, self.replica.port, ssl=ssl
            ),
            self.timeout_s,
        )
        self.protocol = protocol
        assert protocol.transport is not None
        try:
            if self.replica.password:
                auth = (
                    ("AUTH", self.replica.username, self.replica.password)
                    if self.replica.username
                    else ("AUTH", self.replica.password)
                )
                protocol.transport.write(_command(*auth))
                reply = await self._reply()
                if isinstance(reply, Exception):
                    raise ConnectionError(f"AUTH refused: {reply}")
            protocol.transport.write(_command("PSUBSCRIBE", self.pattern))
            reply = await self._reply()
            if isinstance(reply, Exception) or not (
                isinstance(reply, list) and reply[0] == b"psubscribe"
            ):
                raise ConnectionError(f"PSUBSCRIBE refused: {reply!r}")
        except BaseException:
            await self.stop()
            raise
        self._watcher = asyncio.get_running_loop().create_task(self._watch_close())

    async def _watch_close(self) -> None:
        assert self.protocol is not None
        exc = await self.protocol.closed
        if not self._stopping:
            self.error = f"push connection closed: {exc or 'by the server'}"

    async def stop(self) -> None:
        self._stopping = True
        if self.protocol and self.protocol.transport:
            self.protocol.transport.close()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None


class PollObserver(Observer):
    mode = "poll"

    def __init__(self, replica: Endpoint, conn: RespConnection, *, interval_s: float) -> None:
        super().__init__(replica)
        self.conn = conn
        self.interval_s = interval_s
        # key -> (lo_ns, lo_mid_ns): the latest moment the key was surely not applied yet.
        self._outstanding: dict[bytes, tuple[int, int]] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.rounds = 0

    def expect(self, key: bytes, written_lo_ns: int) -> None:
        self._outstanding[key] = (written_lo_ns, written_lo_ns)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            started = loop.time()
            keys = list(self._outstanding)
            if keys:
                try:
                    values, t_a, t_b = await self.conn.call("MGET", *keys)
                except ReplagError as exc:
                    self.error = f"poll failed: {exc.message}"
                    return
                if isinstance(values, hiredis.ReplyError):
                    self.error = f"poll failed: {values}"
                    return
                self.rounds += 1
                mid = (t_a + t_b) // 2
                for key, value in zip(keys, values, strict=True):
                    if value is None:
                        self._outstanding[key] = (t_a, mid)
                    else:
                        lo, lo_mid = self._outstanding.pop(key)
                        self.arrivals[key] = Arrival(
                            estimate_ns=(lo_mid + mid) // 2, lo_ns=lo, hi_ns=t_b
                        )
            delay = self.interval_s - (loop.time() - started)
            await asyncio.sleep(max(delay, 0))

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
