"""A minimal pipelined RESP connection, for the scan hot path and for probe timing.

The one hand-written RESP client in replag (admin and discovery use redis-py):
probe writes and stamps, scans and repairs, and the probe's keyspace-notification
subscription (`on_push`) all go through `RespConnection`. It speaks RESP2 only,
which every Dynomite port requires (Dynomite closes the connection on `HELLO 3`).

redis-py costs ~10 µs of Python per pipelined command; scanning a replica at
300k keys/s needs one PTTL per key, so the scanner packs commands itself and
parses replies with hiredis directly. Replies are grouped per request: one
future resolves with all `n` replies of a request and the moment their bytes
arrived, on the connection's clock (wall time by default; probes use the
monotonic clock). Plain TCP connections read through `StampedSocket`, so
that moment is the kernel's receive timestamp, not when the event loop got
to the bytes (milliseconds later on a busy host); TLS connections, which
asyncio decrypts, are stamped when read, before any parsing.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis

from replag.errors import EndpointError, PermissionRefused
from replag.topology import Endpoint
from replag.wire import reply_bounds, shapes
from replag.wire.connections import (
    NotRespError,
    not_resp,
    permission_refused,
    server_name,
    tls_context,
    translate,
    translate_where,
)
from replag.wire.held import HeldBytes
from replag.wire.reply_limits import (
    DEFAULT,
    NotRespHeader,
    ReplyBound,
    ReplyGuard,
    ReplyLimitError,
    ReplyLimits,
    command_name,
    size_text,
)
from replag.wire.stamped_socket import ReadStamp, StampedSocket, connect_stamped

Arg = bytes | str | int | float


def pack(*args: Arg) -> bytes:
    """One command in RESP (hiredis packs it in C)."""
    return bytes(hiredis.pack_command(args))  # type: ignore[arg-type]


def pack_per_key(command: bytes, keys: Sequence[bytes]) -> bytes:
    """`command key` once per key, packed in one pass (the PTTL/TYPE fan-out of a batch)."""
    # map() over a bound % keeps this at ~0.2 µs per key: it runs once per key scanned.
    template = b"*2\r\n$%d\r\n%s\r\n" % (len(command), command) + b"$%d\r\n%s\r\n"
    return b"".join(map(template.__mod__, zip(map(len, keys), keys, strict=True)))


Clock = Callable[[], int]
# A message the server pushed on a subscribed connection, and when its bytes arrived:
# (message, arrived, earliest). `earliest` < `arrived` when the message was read
# together with later bytes, whose arrival `arrived` is: it came in between.
PushHandler = Callable[[list[Any], int, int], None]
_PUSHED = (b"message", b"pmessage")
# On a subscribed connection: replies (not pushed messages) no request waited for.
_UNREQUESTED_REPLIES = 1000


def pack_multi_and_per_key(multi: bytes, per_key: bytes, keys: Sequence[bytes]) -> bytes:
    """`multi key1 … keyN` then `per_key key` for each key (MGET + PTTL of a scan batch).

    Each key is encoded as a bulk string once and reused by both halves: the two
    joins run in C, which halves the per-key packing cost of the scan's hot path.
    """
    bulks = list(map(b"$%d\r\n%s\r\n".__mod__, zip(map(len, keys), keys, strict=True)))
    head = b"*%d\r\n$%d\r\n%s\r\n" % (len(keys) + 1, len(multi), multi)
    prefix = b"*2\r\n$%d\r\n%s\r\n" % (len(per_key), per_key)
    return head + b"".join(bulks) + prefix + prefix.join(bulks)


def _ending_the_chunk(pushed: list[list[Any]], last: Any, data: bytes) -> int:
    """Index of the first pushed message whose bytes came in the chunk's last packet.

    `arrived` is the arrival of a chunk's last packet (TCP merges packets queued
    unread, keeping the last one's stamp). A message ending the chunk ended in that
    packet; so did the messages just before it on the same channel, because one
    command's keyspace events (`set`, then `expire` for SET … PX) are written to
    the socket together. The others arrived between the previous read and then.
    """
    if not pushed or last is not pushed[-1]:
        return len(pushed)
    try:
        encoded = pack(*last)
    except TypeError:  # not all bulk strings: cannot tell where it ends
        return len(pushed)
    # The chunk ends exactly where the message does (or is the end of it).
    clean = data.endswith(encoded) or encoded.endswith(data)
    if not clean:
        return len(pushed)
    channel = _channel(last)
    first = len(pushed) - 1
    while first > 0 and _channel(pushed[first - 1]) == channel:
        first -= 1
    return first


def _channel(message: list[Any]) -> Any:
    return message[2] if message[0] == b"pmessage" else message[1]


def bulk_strings(keys: Sequence[bytes]) -> bytes:
    """`keys` as consecutive RESP bulk strings (the arguments part of a command).

    Keys of one length (most key schemes) are one join in C; others go through
    hiredis: a scan packs every key it reads, so this is its hot path.
    """
    if not keys:
        return b""
    lengths = list(map(len, keys))
    if lengths.count(lengths[0]) == len(lengths):
        head = b"$%d\r\n" % lengths[0]
        return head + (b"\r\n" + head).join(keys) + b"\r\n"
    packed = bytes(hiredis.pack_command(tuple(keys)))  # type: ignore[arg-type]
    return packed[packed.index(b"\r\n") + 2 :]


def pack_over_keys(keys: Sequence[bytes], *heads: tuple[Arg, ...], bulks: bytes = b"") -> bytes:
    """For each head, the command `*head key1 … keyN` (MGET, EVALSHA sha N, …).

    The keys are encoded as bulk strings once (`bulks`, if the caller has them)
    and reused by every command.
    """
    bulks = bulks or bulk_strings(keys)
    out = []
    for head in heads:
        packed_head = pack(*head)
        # pack() wrote "*<len(head)>\r\n"; the command has len(head) + len(keys) parts.
        star = packed_head.index(b"\r\n")
        out.append(b"*%d" % (len(head) + len(keys)) + packed_head[star:])
        out.append(bulks)
    return b"".join(out)


class _Protocol(asyncio.Protocol):
    def __init__(
        self, clock: Clock, on_push: PushHandler | None = None, limits: ReplyLimits = DEFAULT
    ) -> None:
        self.clock = clock
        self.on_push = on_push
        self.reader = hiredis.Reader()
        self.guard = ReplyGuard(limits)  # checks each chunk before hiredis allocates what it says
        # (replies expected, their future, the request's first bytes: to name its command)
        self.waiting: collections.deque[
            tuple[int, asyncio.Future[tuple[list[Any], int]], bytes]
        ] = collections.deque()
        self.current: list[Any] = []
        self.transport: asyncio.Transport | StampedSocket | None = None
        self.lost: BaseException | None = None
        self.failure: BaseException | None = None  # a protocol error we closed on
        self.first_bytes = b""  # the start of what the peer sent, to name a non-Redis peer
        # Resolves with the exception the connection was lost with (None: closed cleanly).
        self.closed: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future()
        )
        self.bytes_received = 0
        self.limits = limits
        self.unrequested = 0  # bytes (replies, on a subscribed one) no request waited for
        self.held: HeldBytes | None = None  # this connection's share of its server's bytes
        self.asked = 0  # replies requested so far: the stream index of the next one

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TLS transport (under `serve` and agents) is no asyncio.Transport subclass,
        # but has every method used here.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        """From asyncio's transport (TLS): stamped now, as read."""
        arrived = self.clock()
        self.received(data, arrived, arrived)

    def received(self, data: bytes, arrived: int, since: int) -> None:
        self.bytes_received += len(data)
        if not self.first_bytes:
            self.first_bytes = data[:48]
        try:
            self.guard.feed(data)
        except (ReplyLimitError, NotRespHeader) as exc:
            self._refused(exc)
            return
        if self.on_push is not None:
            self._received_with_pushes(data, arrived, since)
            return
        if not self.waiting:
            # Nothing asked: a server flooding replies would grow the reader's buffer for
            # ever (and answer later requests with them).
            self.unrequested += len(data)
            if self.unrequested > self.limits.max_unrequested_bytes:
                self._unrequested(f"{self.unrequested} bytes")
                return
        held = self.held
        if held is not None:
            try:
                held.add(len(data))
            except ReplyLimitError as exc:
                self._refused(exc)
                return
        # Hot loop: one iteration per reply (one per key while scanning), so
        # everything is a local and completion is checked by countdown.
        reader = self.reader
        reader.feed(data)
        gets = reader.gets
        waiting = self.waiting
        current = self.current
        append = current.append
        try:
            while waiting:
                count, future, _ = waiting[0]
                for _ in range(count - len(current)):
                    reply = gets()
                    if reply is False:
                        return
                    append(reply)
                waiting.popleft()
                if held is not None:
                    held.release()  # handed over (a next reply's first bytes with it)
                if not future.done():
                    future.set_result((current, arrived))
                current = self.current = []
                append = current.append
        except hiredis.ProtocolError:
            self._not_resp()

    def _refused(self, exc: ReplyLimitError | NotRespHeader) -> None:
        """A reply over a limit (or a header that is no RESP): every request on this connection
        fails with an error naming the limit and the command answered, and it is dropped."""
        if isinstance(exc, NotRespHeader):
            # Named by the bytes where a reply should begin (not the connection's first).
            self.failure = not_resp(exc.args[0] if exc.args else self.first_bytes)
            if self.transport is not None:
                self.transport.abort()
            return
        what = command = "a message the server pushed"
        if self.waiting:
            count, _, head = self.waiting[0]
            what = command = command_name(head)
            if count > 1:
                what += f" (reply {len(self.current) + 1} of the {count} of a pipelined request)"
        self.failure = ReplyLimitError(f"reply to {what} refused: {exc}", command=command)
        if self.transport is not None:
            self.transport.abort()

    def _unrequested(self, what: str) -> None:
        self.failure = ReplyLimitError(
            f"the server sent {what} that no request asked for, over max_unrequested_bytes "
            f"= {size_text(self.limits.max_unrequested_bytes)}"
        )
        if self.transport is not None:
            self.transport.abort()

    def _not_resp(self) -> None:
        """An HTTP listener, a TLS port, garbage: every request on this connection fails
        with an error that says so, and the connection is dropped."""
        self.failure = not_resp(self.first_bytes)
        if self.transport is not None:
            self.transport.abort()

    def _received_with_pushes(self, data: bytes, arrived: int, since: int) -> None:
        """A subscribed connection: pushed messages go to `on_push`, the rest answer requests."""
        assert self.on_push is not None
        self.reader.feed(data)
        pushed: list[list[Any]] = []
        last: Any = None
        while True:
            try:
                reply = self.reader.gets()
            except hiredis.ProtocolError:
                self._not_resp()
                break
            if reply is False:
                break
            last = reply
            if isinstance(reply, list) and reply and reply[0] in _PUSHED:
                pushed.append(reply)
                continue
            if not self.waiting:
                self.unrequested += 1
                if self.unrequested > _UNREQUESTED_REPLIES:
                    self._unrequested(f"{self.unrequested} replies")
                    return
                continue
            self.current.append(reply)
            if len(self.current) >= self.waiting[0][0]:
                _, future, _ = self.waiting.popleft()
                if not future.done():
                    future.set_result((self.current, arrived))
                self.current = []
        exact = _ending_the_chunk(pushed, last, data)
        for i, message in enumerate(pushed):
            self.on_push(message, arrived, arrived if i >= exact else since)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.held is not None:
            self.held.release()
        self.lost = exc or self.failure or ConnectionResetError("connection closed by the server")
        if not self.closed.done():
            self.closed.set_result(exc or self.failure)
        while self.waiting:
            _, future, _ = self.waiting.popleft()
            if not future.done():
                future.set_exception(self.lost)


class RespConnection:
    """One TCP (or TLS) connection to `endpoint`, authenticated and on the right db."""

    def __init__(self, endpoint: Endpoint, protocol: _Protocol, timeout_s: float) -> None:
        self.endpoint = endpoint
        self._protocol = protocol
        self._timeout_s = timeout_s
        # Whether the server keeps hash-field TTLs: learned when first needed
        # (`repair.keyspace.field_ttls.server_has_field_ttls`).
        self.field_ttls: bool | None = None
        # Small requests by their future, so `wait` checks each reply's shape (`shapes`).
        self._small: dict[int, bytes] = {}

    @classmethod
    async def open(
        cls,
        endpoint: Endpoint,
        *,
        timeout_s: float,
        clock: Clock = time.time_ns,
        on_push: PushHandler | None = None,
    ) -> RespConnection:
        """Connect, AUTH and SELECT as the endpoint says; reply times read on `clock`.

        With `on_push`, the connection is meant for (P)SUBSCRIBE: every message the
        server pushes is handed to it with its arrival time, replies still answer requests.
        """
        loop = asyncio.get_running_loop()
        context = tls_context(endpoint)
        try:
            if context is not None:
                _, protocol = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: _Protocol(clock, on_push, endpoint.limits),
                        endpoint.host,
                        endpoint.port,
                        ssl=context,
                        server_hostname=server_name(endpoint),
                        ssl_handshake_timeout=timeout_s,
                    ),
                    timeout_s,
                )
            else:
                protocol = _Protocol(clock, on_push, endpoint.limits)
                protocol.transport = await asyncio.wait_for(
                    connect_stamped(endpoint.host, endpoint.port, protocol, clock), timeout_s
                )
        except (OSError, TimeoutError) as exc:
            raise translate(exc, endpoint) from exc
        protocol.held = HeldBytes(endpoint)
        conn = cls(endpoint, protocol, timeout_s)
        setup = setup_commands(endpoint)
        if setup:
            try:
                replies = await conn.request(
                    b"".join(setup), len(setup), within=reply_bounds.SMALL_BOUND
                )
                conn.check(replies)
            except BaseException:
                conn.abort()  # a refused AUTH must not leave the socket open
                raise
        return conn

    def send(
        self, payload: bytes, count: int, *, within: ReplyBound | None = None
    ) -> asyncio.Future[tuple[list[Any], int]]:
        """Write `payload` (holding `count` commands); the future gets (replies, arrival ns).
        `within`: what each of its replies can hold (`reply_bounds`), refused past it."""
        protocol = self._protocol
        if protocol.lost is not None or protocol.transport is None:
            kept = NotRespError | TimeoutError | ReplyLimitError
            lost = protocol.lost if isinstance(protocol.lost, kept) else None
            raise translate(lost or ConnectionResetError("connection closed"), self.endpoint)
        future: asyncio.Future[tuple[list[Any], int]] = asyncio.get_running_loop().create_future()
        try:
            protocol.transport.write(payload)
        except OSError as exc:
            # The socket closed (the server hung up) before connection_lost ran.
            raise translate(exc, self.endpoint) from exc
        protocol.waiting.append((count, future, payload[:64]))
        if within is not None and protocol.on_push is None:
            # (On a subscribed connection pushed messages interleave: replies' places unknown.)
            for index in range(protocol.asked, protocol.asked + count):
                protocol.guard.bound(index, within)
        protocol.asked += count
        if len(payload) <= shapes.READ_BACK_BYTES:
            self._small[id(future)] = payload
        return future

    async def wait(
        self, future: asyncio.Future[tuple[list[Any], int]], timeout_s: float | None = None
    ) -> tuple[list[Any], int]:
        """The replies of a `send`, within `timeout_s` (default: the connection's)."""
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation.
            async with asyncio.timeout(timeout_s or self._timeout_s):
                replies, arrived = await future
        except TimeoutError:
            # A hung server: every other request on the connection fails the same way,
            # not as "closed by the server" (it was us who closed it).
            protocol = self._protocol
            if protocol.failure is None:
                protocol.failure = TimeoutError(
                    f"no reply within {self._timeout_s:g}s (the server does not answer)"
                )
            self.abort()
            raise translate(protocol.failure, self.endpoint) from None
        except (OSError, ReplyLimitError) as exc:
            self.abort()
            raise translate(exc, self.endpoint) from exc
        finally:
            payload = self._small.pop(id(future), None)
        if payload is not None:
            shapes.check_request(self.endpoint, payload, replies)
        return replies, arrived

    async def request(
        self,
        payload: bytes,
        count: int,
        timeout_s: float | None = None,
        *,
        within: ReplyBound | None = None,
    ) -> list[Any]:
        replies, _ = await self.wait(self.send(payload, count, within=within), timeout_s)
        return replies

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @property
    def kernel_stamps(self) -> bool:
        """Replies are stamped with the kernel's receive time (else when read)."""
        transport = self._protocol.transport
        return isinstance(transport, StampedSocket) and transport.kernel_stamps

    @property
    def last_read(self) -> ReadStamp | None:
        """How the read being handled (or the last) was stamped; None on TLS (when read)."""
        transport = self._protocol.transport
        return transport.last_read if isinstance(transport, StampedSocket) else None

    @property
    def bytes_received(self) -> int:
        """Bytes this connection has read from the server (what a check pulls across)."""
        return self._protocol.bytes_received

    async def call(self, *args: Arg, within: ReplyBound | None = None) -> tuple[Any, int, int]:
        """One command: (reply, sent, arrived) on the connection's clock; error replies returned.
        Its reply is refused past `within`, or what the command can answer where that is
        known (`reply_bounds.known`: TIME, PING, INFO, ...)."""
        payload = pack(*args)
        bound = within or reply_bounds.known(args, self.endpoint.limits)
        sent = self._protocol.clock()  # just before the bytes go to the socket
        future = self.send(payload, 1, within=bound)
        (reply,), arrived = await self.wait(future)
        return reply, sent, arrived

    async def checked(self, *args: Arg) -> Any:
        """`call`, raising an EndpointError on an error reply."""
        reply, _, _ = await self.call(*args)
        check_replies([reply], self.endpoint, command=args[0])
        return reply

    async def min_rtt_ns(self, rounds: int = 9) -> int:
        """Smallest PING round trip (on a monotonic-clock connection: a one-way bound)."""
        return (await self.rtt_range_ns(rounds))[0]

    async def rtt_range_ns(self, rounds: int = 9) -> tuple[int, int]:
        """Smallest and largest of `rounds` PING round trips: the likeliest one-way trip is
        about half the smallest, and none of the trips seen took longer than the largest."""
        trips = []
        for _ in range(rounds):
            _, sent, arrived = await self.call(b"PING")
            trips.append(arrived - sent)
        return min(trips), max(trips)

    def check(self, replies: Sequence[Any]) -> None:
        """Raise the first error reply as an EndpointError naming the endpoint."""
        check_replies(replies, self.endpoint)

    async def wait_closed(self) -> BaseException | None:
        """Until the connection is lost: the exception it was lost with (None: closed cleanly)."""
        return await asyncio.shield(self._protocol.closed)

    def abort(self) -> None:
        if self._protocol.transport is not None:
            self._protocol.transport.abort()

    async def close(self) -> None:
        transport = self._protocol.transport
        if transport is not None and not transport.is_closing():
            transport.close()
        await asyncio.sleep(0)


def setup_commands(endpoint: Endpoint) -> list[bytes]:
    """What a new connection sends first: AUTH and SELECT as the endpoint says, and READONLY
    to a Redis Cluster node (reads on a replica; harmless on a primary)."""
    setup: list[bytes] = []
    if endpoint.password is not None:
        auth = (endpoint.username, endpoint.password) if endpoint.username else (endpoint.password,)
        setup.append(pack(b"AUTH", *auth))
    if endpoint.db:
        setup.append(pack(b"SELECT", endpoint.db))
    if endpoint.cluster:
        setup.append(pack(b"READONLY"))
    return setup


def check_replies(
    replies: Sequence[Any], endpoint: Endpoint, *, command: Arg | None = None
) -> None:
    """Raise the first error reply as an EndpointError naming `endpoint` (and, for a
    permission refusal, `command` when the reply does not name it)."""
    for reply in replies:
        if isinstance(reply, hiredis.ReplyError):
            text = str(reply)
            if text.startswith("NOPERM"):
                name = command.decode() if isinstance(command, bytes) else command
                what = str(name).upper() if name is not None and "'" not in text else None
                raise PermissionRefused(
                    permission_refused(text, endpoint, what), where=translate_where(endpoint)
                )
            raise translate(_as_redis_error(reply), endpoint)


def _as_redis_error(reply: Exception) -> Exception:
    from redis.exceptions import AuthenticationError, ResponseError

    text = str(reply)
    if text.startswith(("WRONGPASS", "NOAUTH")) or "invalid password" in text:
        return AuthenticationError(text)
    return ResponseError(text)


def error_text(reply: Any) -> str | None:
    """The message of an error reply, None for anything else."""
    return str(reply) if isinstance(reply, hiredis.ReplyError) else None


__all__ = ["EndpointError", "PushHandler", "RespConnection", "error_text", "pack", "pack_per_key"]
