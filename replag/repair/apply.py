"""Safe writes: compare-and-set repairs on each divergent replica's own Redis.

Every write is a WATCH/MULTI/EXEC transaction on the target: the key is read
under WATCH and must still hold what was compared, else nothing is written and
the key is rechecked later. The value comes from the winner, read under its
own WATCH and checked against what the decision was based on, so we only ever
copy a value the winner still holds. DUMP/RESTORE carries the value (and the
remaining TTL, minus the time in between); a RESTORE the target refuses (an
older RDB version) falls back to type-specific writes. Each replica has its
own throttle (keys/s, in-flight) and busy clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from replag.errors import EndpointError
from replag.repair.observe import KeyState, observe_keys
from replag.repair.policy import Decision
from replag.repair.values import StreamEntry
from replag.resp import RespConnection, pack
from replag.topology import Endpoint

Outcome = Literal["repaired", "changed", "dry_run"]
_CHUNK = 1000


class BusyClock:
    """Time during which at least one request to a replica was outstanding."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._inflight = 0
        self._since = 0.0

    @contextlib.contextmanager
    def busy(self) -> Any:
        if self._inflight == 0:
            self._since = time.perf_counter()
        self._inflight += 1
        try:
            yield
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self.seconds += time.perf_counter() - self._since


class RateLimiter:
    """At most `rate` acquisitions per second (0 or None = unlimited), evenly spaced."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        if not self.interval:
            return
        async with self._lock:
            now = time.monotonic()
            wait = self._next - now
            self._next = max(now, self._next) + self.interval
        if wait > 0:
            await asyncio.sleep(wait)


@dataclass
class ReplicaLane:
    """Connections, throttle and counters for one replica of a group."""

    endpoint: Endpoint
    max_inflight: int
    rate: float | None
    timeout_s: float
    clock: BusyClock = field(default_factory=BusyClock)
    writes: int = 0
    _idle: list[RespConnection] = field(default_factory=list)
    _slots: asyncio.Semaphore = field(init=False)
    _limiter: RateLimiter = field(init=False)

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(max(1, self.max_inflight))
        self._limiter = RateLimiter(self.rate)

    @property
    def name(self) -> str:
        return self.endpoint.name

    @contextlib.asynccontextmanager
    async def connection(self, *, write: bool = False) -> AsyncIterator[RespConnection]:
        """A connection of our own (WATCH is per connection), within the in-flight limit."""
        async with self._slots:
            if write:
                await self._limiter.acquire()
            conn = (
                self._idle.pop()
                if self._idle
                else await RespConnection.open(self.endpoint, timeout_s=self.timeout_s)
            )
            clean = False
            try:
                with self.clock.busy():
                    yield conn
                clean = True
            finally:
                if clean:
                    self._idle.append(conn)
                else:
                    conn.abort()

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop().close()


def _typed_writes(key: bytes, state: KeyState) -> list[bytes]:
    """Commands rebuilding `state`'s value without DUMP/RESTORE."""
    data: Any = state.data
    out = [pack(b"DEL", key)]
    if state.type == "string":
        out.append(pack(b"SET", key, data))
    elif state.type == "hash":
        items = list(data.items())
        for i in range(0, len(items), _CHUNK):
            out.append(pack(b"HSET", key, *[x for pair in items[i : i + _CHUNK] for x in pair]))
    elif state.type == "set":
        members = list(data)
        for i in range(0, len(members), _CHUNK):
            out.append(pack(b"SADD", key, *members[i : i + _CHUNK]))
    elif state.type == "zset":
        items = [(repr(score).encode(), member) for member, score in data.items()]
        for i in range(0, len(items), _CHUNK):
            out.append(pack(b"ZADD", key, *[x for pair in items[i : i + _CHUNK] for x in pair]))
    elif state.type == "list":
        for i in range(0, len(data), _CHUNK):
            out.append(pack(b"RPUSH", key, *data[i : i + _CHUNK]))
    elif state.type == "stream":
        entries: Sequence[StreamEntry] = data
        out.extend(pack(b"XADD", key, entry_id, *fields) for entry_id, fields in entries)
    return out


class Applier:
    """Carries out one `Decision` for one key across the lanes of a group."""

    def __init__(
        self, lanes: Sequence[ReplicaLane], *, tolerance_ms: int, dry_run: bool, chunk: int = _CHUNK
    ) -> None:
        self.lanes = lanes
        self.tolerance_ms = tolerance_ms
        self.dry_run = dry_run
        self.chunk = chunk

    async def apply(
        self, key: bytes, decision: Decision, states: Sequence[KeyState]
    ) -> dict[int, Outcome]:
        """Outcome per target replica index."""
        if self.dry_run:
            return {t: "dry_run" for t in decision.targets}
        if decision.action == "delete":
            results = await asyncio.gather(
                *(self._write(t, key, states[t], [pack(b"DEL", key)]) for t in decision.targets)
            )
            return dict(zip(decision.targets, results, strict=True))
        assert decision.winner is not None
        source = await self._read_winner(decision.winner, key, states[decision.winner])
        if source is None:
            return {t: "changed" for t in decision.targets}
        payload, pttl, read_at = source
        winner_state = states[decision.winner]
        results = await asyncio.gather(
            *(
                self._copy(t, key, states[t], winner_state, payload, pttl, read_at)
                for t in decision.targets
            )
        )
        return dict(zip(decision.targets, results, strict=True))

    async def _read_winner(
        self, index: int, key: bytes, expected: KeyState
    ) -> tuple[bytes, int, float] | None:
        async with self.lanes[index].connection() as conn:
            conn.check(await conn.request(pack(b"WATCH", key), 1))
            now = await observe_keys(conn, [key], chunk=self.chunk, keep=False)
            if not now[key].same_as(expected, self.tolerance_ms):
                conn.check(await conn.request(pack(b"UNWATCH"), 1))
                return None
            replies = await conn.request(
                pack(b"MULTI") + pack(b"DUMP", key) + pack(b"PTTL", key) + pack(b"EXEC"), 4
            )
            conn.check(replies[:1])
            result = replies[3]
            if result is None or not isinstance(result[0], bytes):
                return None  # the winner changed after we read it
            return result[0], int(result[1]), time.monotonic()

    async def _copy(
        self,
        target: int,
        key: bytes,
        expected: KeyState,
        winner: KeyState,
        payload: bytes,
        pttl: int,
        read_at: float,
    ) -> Outcome:
        def remaining_ms() -> int | None:
            """The winner's TTL left now; None once it has expired. Read at write time:
            waiting for the rate limiter must not stretch the copy's life."""
            if pttl < 0:
                return 0
            left = pttl - int((time.monotonic() - read_at) * 1000)
            return left if left > 0 else None

        if expected.exists and expected.same_value(winner):
            # Only the expiry differs: leave the value alone.
            def ttl_fix() -> list[bytes] | None:
                left = remaining_ms()
                if left is None:
                    return None
                return [pack(b"PEXPIRE", key, left) if left else pack(b"PERSIST", key)]

            return await self._write(target, key, expected, ttl_fix)

        def restore() -> list[bytes] | None:
            left = remaining_ms()
            return None if left is None else [pack(b"RESTORE", key, left, payload, b"REPLACE")]

        try:
            return await self._write(target, key, expected, restore)
        except EndpointError as exc:
            if "payload" not in exc.message.lower() or winner.data is None:
                raise

        # The target cannot read the winner's DUMP format (an older server):
        # rebuild the value with type-specific writes, still under WATCH.
        def typed() -> list[bytes] | None:
            left = remaining_ms()
            if left is None:
                return None
            commands = _typed_writes(key, winner)
            if left:
                commands.append(pack(b"PEXPIRE", key, left))
            return commands

        return await self._write(target, key, expected, typed)

    async def _write(
        self,
        target: int,
        key: bytes,
        expected: KeyState,
        commands: list[bytes] | Callable[[], list[bytes] | None],
    ) -> Outcome:
        """Under WATCH: if the key still holds `expected`, run `commands` in MULTI/EXEC.

        `commands` may be a function, called once the connection (and the rate
        limiter's slot) is ours, so a TTL in it is computed at the moment of writing;
        it returns None when there is nothing valid left to write (winner expired).
        """
        lane = self.lanes[target]
        async with lane.connection(write=True) as conn:
            conn.check(await conn.request(pack(b"WATCH", key), 1))
            now = await observe_keys(conn, [key], chunk=self.chunk, keep=False)
            if not now[key].same_as(expected, self.tolerance_ms):
                conn.check(await conn.request(pack(b"UNWATCH"), 1))
                return "changed"
            built = commands() if callable(commands) else commands
            if built is None:
                conn.check(await conn.request(pack(b"UNWATCH"), 1))
                return "changed"
            commands = built
            body = [pack(b"MULTI"), *commands, pack(b"EXEC")]
            replies = await conn.request(b"".join(body), len(body))
            conn.check(replies[:1])
            result = replies[-1]
            if result is None:
                return "changed"
            conn.check(result)
            lane.writes += len(commands)
            return "repaired"
