"""A replica as a repair reaches it (`ReplicaLane`): connections, throttle, busy time, and
the steps of `apply` made on it, here or through its region's agent.

Every read and write of a repair takes a turn on the replica's lane: within its
in-flight limit and write rate, timed as busy. A lane whose region runs an agent
has a `remote`: its reads and writes are made there, next to the replica, with
the same compare-and-write steps (`guarded_write`). Typed writes, and undos that
replay a client's element changes, are made only on lanes reached directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from replag.errors import EndpointError
from replag.repair.keyspace.field_ttls import same_field_expiries, server_has_field_ttls
from replag.repair.keyspace.observe import KeyState, observe_keys
from replag.repair.keyspace.values import Data, read_values
from replag.repair.keyspace.write import Write
from replag.repair.writes.guarded_write import (
    compare_and_write,
    elapsed_ms,
    read_for_copy_with_data,
)
from replag.repair.writes.undo import PreImage, overwritten, undo
from replag.topology import Endpoint
from replag.wire.resp import RespConnection


class RemoteReplica(Protocol):
    """A replica reached through its region's agent (`repair.remote.AgentReplica`)."""

    async def read_for_copy(
        self, key: bytes, expected: KeyState, tolerance_ms: int
    ) -> tuple[bytes, int] | None: ...

    async def write(
        self, key: bytes, expected: KeyState, write: Write, age_ms: int, tolerance_ms: int
    ) -> tuple[bytes | None, int, int] | None: ...

    async def observe(self, keys: Sequence[bytes]) -> dict[bytes, KeyState]: ...


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
    bytes_received: int = 0
    remote: RemoteReplica | None = None  # reads and writes go through the region's agent
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
    async def turn(self, *, write: bool = False) -> AsyncIterator[None]:
        """A request's turn: within the in-flight limit (and the write rate), timed busy."""
        async with self._slots:
            if write:
                await self._limiter.acquire()
            with self.clock.busy():
                yield

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
            before = conn.bytes_received
            try:
                with self.clock.busy():
                    yield conn
                clean = True
            finally:
                self.bytes_received += conn.bytes_received - before
                if clean:
                    self._idle.append(conn)
                else:
                    conn.abort()

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop().close()

    # --- the steps of `apply` on this replica ----------------------------------

    async def observe(self, keys: Sequence[bytes], *, chunk: int) -> dict[bytes, KeyState]:
        if self.remote is not None:
            async with self.turn():
                return await self.remote.observe(keys)
        async with self.connection() as conn:
            return await observe_keys(conn, keys, chunk=chunk, keep=False)

    async def read_for_copy(
        self, key: bytes, expected: KeyState, *, tolerance_ms: int, chunk: int
    ) -> tuple[bytes, int, float, Data | None] | None:
        """Step 1 on the winner: its DUMP and PTTL if it still holds `expected`, when they
        were read (monotonic), and (read here, not through an agent) a small collection's
        elements to merge an undo with, all of one moment."""
        data: Data | None = None
        if self.remote is not None:
            async with self.turn():
                read = await self.remote.read_for_copy(key, expected, tolerance_ms)
        else:
            async with self.connection() as conn:
                read, data = await read_for_copy_with_data(
                    conn, key, expected, tolerance_ms=tolerance_ms, chunk=chunk
                )
        return None if read is None else (read[0], read[1], time.monotonic(), data)

    async def write(
        self,
        key: bytes,
        expected: KeyState,
        write: Write | Callable[[], list[bytes] | None],
        since: float,
        *,
        tolerance_ms: int,
        chunk: int,
    ) -> PreImage | None:
        """Step 2 on this replica: what the write replaced, or None if nothing was written.
        TTLs in `write` count from `since` (monotonic) to the moment of writing, so waiting
        for the rate limiter never stretches a copy's life."""
        if self.remote is not None:
            if not isinstance(write, Write):
                raise EndpointError(
                    "typed writes (for a server that refuses the winner's DUMP) are not sent "
                    "through agents",
                    where=self.name,
                )
            async with self.turn(write=True):
                done = await self.remote.write(
                    key, expected, write, elapsed_ms(since), tolerance_ms
                )
        else:
            commands: Callable[[], list[bytes] | None] = (
                (lambda: write.commands(key, elapsed_ms(since)))
                if isinstance(write, Write)
                else write
            )
            async with self.connection(write=True) as conn:
                done = await compare_and_write(
                    conn, key, expected, commands, tolerance_ms=tolerance_ms, chunk=chunk
                )
        if done is None:
            return None
        pre_image, pre_pttl, count = done
        self.writes += count
        # WATCH made the pre-image the compared state, so its type is `expected`'s.
        pre_type = expected.type if pre_image is not None else None
        return PreImage(pre_type, pre_image, pre_pttl, time.monotonic())

    async def read_whole(self, key: bytes, expected: KeyState, *, chunk: int) -> KeyState | None:
        """The whole value of `key` for type-specific writes, read again (on this rare path
        memory grows with the value); None if it no longer has `expected`'s digest."""
        assert expected.type is not None
        async with self.connection() as conn:
            fields = await server_has_field_ttls(conn)
            reads = await read_values(
                conn, [(key, expected.type)], chunk=chunk, keep=True, field_ttls=fields
            )
        read = reads[key]
        if (
            read is None
            or read.digest != expected.digest
            or not same_field_expiries(read.field_expiries, expected.field_expiries, 0)
        ):
            return None
        return KeyState(
            True,
            read.type,
            read.digest,
            expected.expiry_ms,
            read.data,
            field_expiries=read.field_expiries,
        )

    async def put_back(
        self,
        key: bytes,
        *,
        wrote: KeyState,
        wrote_data: Data | None,
        before: PreImage,
        retry_s: float,
        tolerance_ms: int,
        chunk: int,
    ) -> bool | None:
        """Step 3's undo of a write that did not stand (`undo.undo`): True if put back, None
        if a client's write replaced the copy (it stays), False if it could not be undone
        (a client changed the copy in place: through an agent at once, here after a few
        tries `retry_s` apart)."""
        if self.remote is not None:
            # Through an agent: the compare-and-set restore of the pre-image only. A copy
            # a client deleted or overwrote since is left to that write; one changed in
            # place cannot be merged there, so it is reported, never guessed.
            again = Write("undo", before.dump, before.pttl)
            if await self.write(
                key, wrote, again, before.at, tolerance_ms=tolerance_ms, chunk=chunk
            ):
                return True
            async with self.turn():
                now = (await self.remote.observe([key]))[key]
            return None if overwritten(now, wrote) else False
        for attempt in range(3):
            if attempt:
                await asyncio.sleep(retry_s)
            async with self.connection(write=True) as conn:
                outcome = await undo(
                    conn,
                    key,
                    wrote=wrote,
                    wrote_data=wrote_data,
                    before=before,
                    tolerance_ms=tolerance_ms,
                    chunk=chunk,
                )
            if outcome in ("restored", "merged"):
                self.writes += 1
                return True
            if outcome == "client_wrote":
                return None
        return False
