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
import logging
import time
from collections.abc import Callable
from typing import Any

from replag.errors import UnreachableError
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, pack

log = logging.getLogger(__name__)

# (key, event, arrived_ns, since_ns): the event reached us within [since_ns, arrived_ns] on
# the monotonic clock (one instant when the kernel stamped the bytes that carried it alone).
Listener = Callable[[bytes, bytes, int, int], None]
NEEDED_CLASSES = "g$lshzxet"
INVALIDATE = b"__redis__:invalidate"
# A prefix no key has: tracking then reports only whole-database flushes.
_NO_KEYS_PREFIX = b"\x00replag-agent-tracks-flushes-only\x00"


def notifications_cover(flags: str) -> bool:
    """Do `notify-keyspace-events` flags publish every change of every key on the keyspace
    channel?"""
    classes = set(flags.replace("A", NEEDED_CLASSES))
    return "K" in flags and set(NEEDED_CLASSES) <= classes


# Asked for too where the agent turns notifications on, never required: `n` (a key was
# created) is the only event of a new vector set or module value (Redis 8.2 publishes
# none for VADD or GRAPH.QUERY), which the tree then reads (`scan.scanner.NOTIFIED`).
WANTED_CLASSES = "n"


def notifications_with_ours(flags: str) -> str:
    """`flags` plus what the agent needs and wants; nothing the operator set is taken away."""
    return "".join(sorted(set(flags) | set("K" + NEEDED_CLASSES + WANTED_CLASSES)))


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
        self._conn: RespConnection | None = None
        self._watch: asyncio.Task[None] | None = None

    def add_listener(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def on_flush(self, listener: Callable[[], None]) -> None:
        self.flush_listeners.append(listener)

    def _pushed(self, msg: list[Any], arrived_ns: int, since_ns: int) -> None:
        if len(msg) == 4 and msg[0] == b"pmessage":
            self.events += 1
            key = msg[2][len(self.channel_prefix) :]
            for listener in self.listeners:
                listener(key, msg[3], arrived_ns, since_ns)
        elif len(msg) == 3 and msg[1] == INVALIDATE and msg[2] is None:
            self.flushes += 1
            for flushed in self.flush_listeners:
                flushed()

    async def open(self) -> KeyspaceFeed:
        """Connect, authenticate, track flushes and PSUBSCRIBE; events flow from then on."""
        conn = await RespConnection.open(
            self.endpoint, timeout_s=self.timeout_s, clock=time.monotonic_ns, on_push=self._pushed
        )
        self._conn = conn
        try:
            await self._track_flushes(conn)
            (reply,) = await conn.request(pack(b"PSUBSCRIBE", self.channel_prefix + b"*"), 1)
            if not (isinstance(reply, list) and reply[:1] == [b"psubscribe"]):
                raise UnreachableError(
                    f"PSUBSCRIBE refused: {reply!r}",
                    where=f"{self.endpoint.name} ({self.endpoint.url()})",
                )
        except BaseException:
            conn.abort()
            raise
        self._watch = asyncio.create_task(self._wait_lost(conn))
        return self

    async def _wait_lost(self, conn: RespConnection) -> None:
        exc = await conn.wait_closed()
        if not self.closed.done():
            self.closed.set_result(str(exc) if exc else "connection closed by the server")

    async def _track_flushes(self, conn: RespConnection) -> None:
        (own_id,) = await conn.request(pack(b"CLIENT", b"ID"), 1)
        if not isinstance(own_id, int):
            log.warning(
                "%s: CLIENT ID refused (%s); flushes are noticed by polling only",
                self.endpoint.name,
                own_id,
            )
            return
        tracking = pack(
            b"CLIENT", b"TRACKING", b"ON", b"REDIRECT", own_id, b"BCAST", b"PREFIX", _NO_KEYS_PREFIX
        )
        (reply,) = await conn.request(tracking, 1)
        if reply != b"OK":
            log.warning(
                "%s: CLIENT TRACKING refused (%s); flushes are noticed by polling only",
                self.endpoint.name,
                reply,
            )
            return
        (reply,) = await conn.request(pack(b"SUBSCRIBE", INVALIDATE), 1)
        self.tracks_flushes = isinstance(reply, list) and reply[:1] == [b"subscribe"]

    async def fence(self) -> None:
        """Return once every event published before this call reached the listeners."""
        if self._conn is None or self.closed.done():
            raise UnreachableError(
                "notification connection is closed",
                where=f"{self.endpoint.name} ({self.endpoint.url()})",
            )
        await self._conn.request(pack(b"PING"), 1)

    def close(self) -> None:
        if not self.closed.done():
            self.closed.set_result("closed by the agent")
        if self._conn is not None:
            self._conn.abort()
        if self._watch is not None:
            self._watch.cancel()
