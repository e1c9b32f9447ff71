"""One subscription to a replica's keyspace notifications, shared by everything an agent runs.

The replica publishes `__keyspace@<db>__:<key>` → event name when it applies a
write, a delete, an expiry or an eviction. `KeyspaceFeed` reads that stream on
its own socket with a hiredis parser and hands every event, stamped on the
monotonic clock as its bytes arrive, to its listeners: the tree keeper marks
the key for re-reading; a lag observer can watch probe keys arrive on the same
subscription (`add_listener`), so a replica serves one subscription per agent.

`fence()` sends PING on the subscribed connection: Redis answers it in order
with the messages, so when the PONG is back every event of a write applied
before the PING was processed has been delivered. A lost connection resolves
`closed`: whoever relies on the events must assume some were lost.

Some changes publish no key events: FLUSHDB/FLUSHALL, and a replica's full
resynchronisation, which replaces its data wholesale. For those the same
connection turns on client tracking in broadcast mode, redirected to itself,
for a key prefix nothing uses: Redis then sends it nothing but the null
invalidation it broadcasts when a database is emptied (Redis ≥ 6, Valkey),
which `on_flush` listeners receive.

Notifications must be on: `K` (keyspace channel) and the classes `g$lshzxet`
(generic, string, list, set, hash, zset, expired, evicted, stream) or `A`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
from collections.abc import Callable

import hiredis

from replag.connections import translate
from replag.errors import UnreachableError
from replag.resp import pack
from replag.topology import Endpoint

log = logging.getLogger(__name__)

Listener = Callable[[bytes, bytes, int], None]  # (key, event, arrival monotonic ns)
NEEDED_CLASSES = "g$lshzxet"
INVALIDATE = b"__redis__:invalidate"
# A prefix no key has: tracking then reports only whole-database flushes.
_NO_KEYS_PREFIX = b"\x00replag-agent-tracks-flushes-only\x00"


def notifications_cover(flags: str) -> bool:
    """Do `notify-keyspace-events` flags publish every change of every key on the keyspace
    channel?"""
    classes = set(flags.replace("A", NEEDED_CLASSES))
    return "K" in flags and set(NEEDED_CLASSES) <= classes


def notifications_with_ours(flags: str) -> str:
    """`flags` plus what the agent needs; nothing the operator set is taken away."""
    return "".join(sorted(set(flags) | set("K" + NEEDED_CLASSES)))


class _FeedProtocol(asyncio.Protocol):
    def __init__(self, feed: KeyspaceFeed) -> None:
        self.feed = feed
        self.reader = hiredis.Reader()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        self.reader.feed(data)
        feed = self.feed
        prefix_len = len(feed.channel_prefix)
        while True:
            try:
                msg = self.reader.gets()
            except hiredis.ProtocolError as exc:
                feed.fail(f"protocol error on the notification connection: {exc}")
                return
            if msg is False:
                return
            if isinstance(msg, list) and len(msg) == 4 and msg[0] == b"pmessage":
                feed.events += 1
                key = msg[2][prefix_len:]
                for listener in feed.listeners:
                    listener(key, msg[3], now)
            elif isinstance(msg, list) and len(msg) == 3 and msg[:2] == [b"message", INVALIDATE]:
                if msg[2] is None:
                    feed.flushes += 1
                    for flushed in feed.flush_listeners:
                        flushed()
            else:
                feed.reply(msg)

    def connection_lost(self, exc: Exception | None) -> None:
        self.feed.fail(str(exc) if exc else "connection closed by the server")


class KeyspaceFeed:
    """Keyspace notifications of one replica (a db), delivered to listeners as they arrive."""

    def __init__(self, endpoint: Endpoint, *, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.channel_prefix = f"__keyspace@{endpoint.db}__:".encode()
        self.listeners: list[Listener] = []
        self.flush_listeners: list[Callable[[], None]] = []
        self.events = 0
        self.flushes = 0
        self.tracks_flushes = False
        self.closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._protocol: _FeedProtocol | None = None
        self._replies: collections.deque[asyncio.Future[object]] = collections.deque()

    def add_listener(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def on_flush(self, listener: Callable[[], None]) -> None:
        self.flush_listeners.append(listener)

    async def open(self) -> KeyspaceFeed:
        """Connect, authenticate, track flushes and PSUBSCRIBE; events flow from then on."""
        ep = self.endpoint
        loop = asyncio.get_running_loop()
        context = ssl.create_default_context() if ep.tls else None
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _FeedProtocol(self), ep.host, ep.port, ssl=context),
                self.timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise translate(exc, ep) from exc
        self._protocol = protocol
        try:
            if ep.password is not None:
                auth = (ep.username, ep.password) if ep.username else (ep.password,)
                reply = await self._request(pack(b"AUTH", *auth))
                if isinstance(reply, hiredis.ReplyError):
                    raise translate(_auth_error(str(reply)), ep)
            await self._track_flushes()
            reply = await self._request(pack(b"PSUBSCRIBE", self.channel_prefix + b"*"))
            if not (isinstance(reply, list) and reply and reply[0] == b"psubscribe"):
                raise UnreachableError(
                    f"PSUBSCRIBE refused: {reply!r}", where=f"{ep.name} ({ep.url()})"
                )
        except BaseException:
            self.close()
            raise
        return self

    async def _track_flushes(self) -> None:
        own_id = await self._request(pack(b"CLIENT", b"ID"))
        if not isinstance(own_id, int):
            log.warning(
                "%s: CLIENT ID refused (%s); flushes will be noticed by polling only",
                self.endpoint.name,
                own_id,
            )
            return
        tracking = pack(
            b"CLIENT", b"TRACKING", b"ON", b"REDIRECT", own_id, b"BCAST", b"PREFIX", _NO_KEYS_PREFIX
        )
        reply = await self._request(tracking)
        if reply != b"OK":
            log.warning(
                "%s: CLIENT TRACKING refused (%s); flushes will be noticed by polling only",
                self.endpoint.name,
                reply,
            )
            return
        reply = await self._request(pack(b"SUBSCRIBE", INVALIDATE))
        self.tracks_flushes = isinstance(reply, list) and reply[:1] == [b"subscribe"]

    def reply(self, msg: object) -> None:
        if self._replies:
            future = self._replies.popleft()
            if not future.done():
                future.set_result(msg)

    def fail(self, reason: str) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)
        while self._replies:
            future = self._replies.popleft()
            if not future.done():
                future.set_exception(
                    UnreachableError(
                        f"notification connection lost: {reason}",
                        where=f"{self.endpoint.name} ({self.endpoint.url()})",
                    )
                )
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.abort()

    async def _request(self, payload: bytes) -> object:
        protocol = self._protocol
        if protocol is None or protocol.transport is None or self.closed.done():
            raise UnreachableError(
                "notification connection is closed",
                where=f"{self.endpoint.name} ({self.endpoint.url()})",
            )
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._replies.append(future)
        protocol.transport.write(payload)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await future
        except TimeoutError:
            self.fail("no answer within the timeout")
            raise UnreachableError(
                "notification connection: no answer within the timeout",
                where=f"{self.endpoint.name} ({self.endpoint.url()})",
            ) from None

    async def fence(self) -> None:
        """Return once every event published before this call reached the listeners."""
        await self._request(pack(b"PING"))

    def close(self) -> None:
        self.fail("closed by the agent")


def _auth_error(text: str) -> Exception:
    from redis.exceptions import AuthenticationError

    return AuthenticationError(text)
