"""Safe writes: a repair write stands only if the winner still justifies it after it lands.

For one key with winner W (the replica whose state the policy chose; for a
delete, "absent") and targets T1..Tn, on each replica's own Redis:

1. **Read the winner.** WATCH the key on W, read it (the same canonical digest
   as the check) and require the compared value and expiry; MULTI DUMP PTTL
   EXEC then carries exactly that value (EXEC aborts if W changed meanwhile).
2. **Write each target.** WATCH the key on T, read it, require what the
   decision saw, then MULTI DUMP PTTL <write> EXEC: EXEC aborts if anything
   touched the key since the WATCH, so the write replaces exactly the compared
   state, and the DUMP in the same transaction is T's state just before it
   (the pre-image).
3. **Re-verify, else undo.** `repair_settle` after this key's own writes,
   read the key on every replica. The repair stands only if every replica
   now holds W's state. Otherwise each target is put back (`undo`): under
   WATCH, if it still holds what we wrote, RESTORE the pre-image (DEL if it
   had no key); if a client deleted or overwrote it since, that write stays;
   if a client changed it in place (HSET, SADD, ZADD, EXPIRE on the copy of a
   hash, set or sorted set), the pre-image with exactly those element and
   expiry changes replayed on it. The key is rechecked in a later round; one
   still moving after the last round is reported `busy`, never guessed.

Why (3) is needed and why it is enough. (2) guards against every client write
that changes T's state, before ours (the compare) or after it (the undo's
WATCH). It cannot see a write that did not change T: a DEL of a key T already
lacked, a PEXPIREAT on an absent key. Such a write, applied to T just before
our copy and still on its way to W, is how a deleted key came back (issue 9):
T "still held what was compared" (nothing) and received W's old value. Every
client write goes to every replica; if it reaches all of them within
`repair_settle`, it has reached W by the re-verification in (3), W no longer
holds the copied state, and the copy is undone. So after a repair each target
holds W's state as W held it `repair_settle` after the write (repaired), or its
own state from before the repair, or a later client write: never a value older
than a write it had applied, never one a delete had removed. The single
assumption is that bound: `repair_settle` must exceed the time a write takes to
reach every replica of the group (the p99 replication lag `replag probe`
measures, with margin). A value that comes back to W after changing (A→B→A)
is W's current value again, so copying it is still justified.

The undo itself must not lose what clients wrote meanwhile. Between the copy
and the undo the copy is visible, and a client's next write may land on it: a
full overwrite or a delete simply stays; an in-place change to a collection is
replayed onto the pre-image, element by element, which is what the key would
hold had that write met the pre-image. That is exact for element writes (HSET,
HDEL, SADD, SREM, ZADD, ZREM) and expiry writes; the window is kept to
`repair_settle` by timing each key's check from its own writes. What cannot be
separated (a list or stream changed in place, a collection over `MERGE_LIMIT`
elements) is reported as `undo_failed` and the key as busy, never guessed; a
string with a new value is taken as overwritten (APPEND or INCR on the copy
cannot be told from a SET).

DUMP/RESTORE carries the value and the remaining TTL (computed at the moment
of writing); a target that refuses the winner's DUMP format (an older server)
gets type-specific writes in the same transaction. Each replica has its own
throttle (keys/s, in-flight) and busy clock.

Where a replica's region runs an agent, the lane's `remote` makes steps 1 and 2
(and the reads of 3) there, next to the replica, with these same functions
(`read_for_copy`, `compare_and_write`): the write travels as data (`Write`) and
its TTL is computed by the agent when it writes, from the time since the
winner was read (which leaves out the one-way trip of the request: a copy may
live that much longer). Typed writes, and undos that replay a client's element
changes, are made only here; through an agent an undo restores the pre-image only
while the target still holds the copy, and a copy a client changed in place there is
reported (`undo_failed`, the key busy).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from replag.errors import EndpointError, KeyRefused
from replag.repair.observe import ABSENT, KeyState, observe_keys
from replag.repair.pages import PageOptions, is_big, repair_big_key
from replag.repair.policy import Decision
from replag.repair.timeouts import request_within
from replag.repair.together import all_of
from replag.repair.undo import PreImage, collection_data, overwritten, undo
from replag.repair.values import Data, StreamEntry, read_values
from replag.resp import RespConnection, error_text, pack
from replag.topology import Endpoint


@dataclass(frozen=True)
class Refused:
    """A server refused a read or write of this key: which replica, and what it said."""

    replica: str
    message: str

    def __str__(self) -> str:
        return f"{self.replica} refused: {self.message}"


Outcome = Literal["repaired", "changed", "dry_run"] | Refused
_CHUNK = 1000
logger = logging.getLogger(__name__)
WriteOp = Literal["delete", "restore", "expire", "undo", "purge"]


@dataclass(frozen=True)
class Write:
    """A repair write as data: made over a key only once it still holds what was compared.

    `pttl` is the source's remaining TTL (ms, -1 none) when it was read: the copy's TTL
    is computed when the write is made, from the time elapsed since (`commands`).
    """

    op: WriteOp
    payload: bytes | None = None  # the winner's DUMP (restore) or the target's pre-image (undo)
    pttl: int = -1

    def commands(self, key: bytes, elapsed_ms: int) -> list[bytes] | None:
        """The commands to run now; None when nothing valid is left (the source expired)."""
        if self.op == "delete":
            return [pack(b"DEL", key)]
        if self.op == "purge":
            # On a primary lacking the key: a DEL of a missing key is not replicated, a
            # SET then DEL in one transaction is, and removes the key from its replicas.
            return [pack(b"SET", key, b""), pack(b"DEL", key)]
        left = self.pttl - elapsed_ms if self.pttl >= 0 else 0  # 0: no expiry
        if self.op == "undo":
            if self.payload is None or (self.pttl >= 0 and left <= 0):
                return [pack(b"DEL", key)]  # there was no key, or it would have expired
            return [pack(b"RESTORE", key, left, self.payload, b"REPLACE")]
        if self.pttl >= 0 and left <= 0:
            return None
        if self.op == "expire":
            return [pack(b"PEXPIRE", key, left) if left else pack(b"PERSIST", key)]
        assert self.payload is not None
        return [pack(b"RESTORE", key, left, self.payload, b"REPLACE")]


def raise_refusal(conn: RespConnection, replies: Sequence[Any]) -> None:
    """KeyRefused (naming the replica) for the most telling error among a transaction's
    replies, the EXEC result's elements included: a queued command's own refusal
    (READONLY, NOPERM, OOM) rather than the EXECABORT it causes."""
    flat: list[Any] = []
    for reply in replies:
        flat.extend(reply if isinstance(reply, list) else [reply])
    errors = [text for reply in flat if (text := error_text(reply)) is not None]
    if errors:
        telling = next((e for e in errors if not e.startswith("EXECABORT")), errors[0])
        raise KeyRefused(telling, where=conn.endpoint.name)


async def read_for_copy(
    conn: RespConnection, key: bytes, expected: KeyState, *, tolerance_ms: int, chunk: int
) -> tuple[bytes, int] | None:
    """Step 1 on the winner: (DUMP, PTTL) if the key still holds `expected`, else None."""
    read, _ = await read_for_copy_with_data(
        conn, key, expected, tolerance_ms=tolerance_ms, chunk=chunk, collect=False
    )
    return read


async def read_for_copy_with_data(
    conn: RespConnection,
    key: bytes,
    expected: KeyState,
    *,
    tolerance_ms: int,
    chunk: int,
    collect: bool = True,
) -> tuple[tuple[bytes, int] | None, Data | None]:
    """`read_for_copy`, and (`collect`) the elements of a hash, set or sorted set of at
    most `undo.MERGE_LIMIT` elements, read under the same WATCH: of the same moment as
    the DUMP."""
    conn.check(await conn.request(pack(b"WATCH", key), 1))
    now = await observe_keys(conn, [key], chunk=chunk, keep=False)
    if not now[key].same_as(expected, tolerance_ms):
        conn.check(await conn.request(pack(b"UNWATCH"), 1))
        return None, None
    data = await collection_data(conn, key, expected, chunk) if collect else None
    replies = await request_within(
        conn,
        pack(b"MULTI") + pack(b"DUMP", key) + pack(b"PTTL", key) + pack(b"EXEC"),
        4,
        base_s=conn.timeout_s,
        what=f"DUMP of {key!r}",
    )
    raise_refusal(conn, replies)
    result = replies[3]
    if result is None or not isinstance(result[0], bytes):
        return None, None  # the winner changed after we read it
    return (result[0], int(result[1])), data


async def compare_and_write(
    conn: RespConnection,
    key: bytes,
    expected: KeyState,
    commands: Callable[[], list[bytes] | None],
    *,
    tolerance_ms: int,
    chunk: int,
) -> tuple[bytes | None, int, int] | None:
    """Step 2 on a target: under WATCH, if the key still holds `expected`, run `commands()`
    in MULTI/EXEC after a DUMP and PTTL of what they replace. (pre-image or None for no
    key, its PTTL, commands run), or None if nothing was written.

    `commands` is called once the connection is ours, so a TTL in it is computed at the
    moment of writing; it returns None when there is nothing valid left to write.
    """
    conn.check(await conn.request(pack(b"WATCH", key), 1))
    now = await observe_keys(conn, [key], chunk=chunk, keep=False)
    if not now[key].same_as(expected, tolerance_ms):
        conn.check(await conn.request(pack(b"UNWATCH"), 1))
        return None
    built = commands()
    if built is None:
        conn.check(await conn.request(pack(b"UNWATCH"), 1))
        return None
    body = [pack(b"MULTI"), pack(b"DUMP", key), pack(b"PTTL", key), *built, pack(b"EXEC")]
    replies = await request_within(
        conn, b"".join(body), len(body), base_s=conn.timeout_s, what=f"writing {key!r}"
    )
    # A refusal (READONLY, NOPERM, OOM: EXECABORT; a RESTORE's bad payload inside EXEC)
    # is this key's error, not the run's.
    raise_refusal(conn, replies)
    result = replies[-1]
    if result is None:
        return None
    pre_image = result[0] if isinstance(result[0], bytes) else None
    return pre_image, int(result[1]), len(built)


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


@dataclass
class _Written:
    """One transaction that wrote a target: what to put back if the repair does not stand."""

    target: int
    before: PreImage


@dataclass
class _Attempt:
    """One key whose writes await re-verification: every replica should hold `expected`."""

    key: bytes
    expected: KeyState
    written: list[_Written]
    complete: bool  # every target was written (none had changed or refused)
    refused: Refused | None = None  # a target refused its write
    # Members that must hold `expected` for the repair to stand (None: every one).
    check: tuple[int, ...] | None = None
    undo: bool = True  # False: the write re-asserted the state it replaced
    stood: bool = False  # re-verified: every replica held `expected`
    expected_data: Data | None = None  # the copied collection's elements, to merge an undo


class Applier:
    """Carries out the `Decision`s of a batch of keys across the lanes of a group."""

    def __init__(
        self,
        lanes: Sequence[ReplicaLane],
        *,
        tolerance_ms: int,
        settle_s: float,
        dry_run: bool,
        chunk: int = _CHUNK,
        pages: PageOptions | None = None,
        page_elements: int = 0,
    ) -> None:
        self.lanes = lanes
        # Collections above page_elements are copied in pages (`pages`), never DUMPed.
        self.pages, self.page_elements = pages, page_elements
        self.tolerance_ms = tolerance_ms
        self.settle_s = settle_s
        self.dry_run = dry_run
        self.chunk = chunk
        self.undone = 0  # target writes put back because the repair did not stand
        self.undo_failed: list[bytes] = []  # keys a client changed in place before the undo
        # Keys whose primary held the written state at re-verification while these
        # replicas did not: they did not follow within `settle_s` (lagging, or stuck).
        self.unfollowed: dict[bytes, list[str]] = {}

    async def apply_batch(
        self, items: Sequence[tuple[bytes, Decision, Sequence[KeyState]]]
    ) -> list[Outcome]:
        """One outcome per (key, copy-or-delete decision, states): written and re-verified
        `settle_s` later ("repaired"), or undone / not written because something moved
        ("changed")."""
        if self.dry_run:
            return ["dry_run"] * len(items)
        return await all_of(self._repair_key(*item) for item in items)

    async def _repair_key(
        self, key: bytes, decision: Decision, states: Sequence[KeyState]
    ) -> Outcome:
        """Steps 1 to 3 for one key. The re-verification is timed from this key's own
        writes, not the batch's: a client's partial write (HSET, SADD, EXPIRE) landing
        on a copy before its undo would be merged into it, so the window is kept short."""
        try:
            if await self._big(key, decision, states):
                return await self._repair_big(key, decision, states)
            attempt = await self._attempt(key, decision, states)
        except KeyRefused as exc:  # the winner's read
            return Refused(exc.where or "?", exc.message)
        if attempt is None:
            return "changed"
        if attempt.written:
            await asyncio.sleep(self.settle_s)
            now = await self._observe([key])
            await self._settle(attempt, now)
            if not attempt.stood and decision.via is not None:
                self._note_unfollowed(attempt, decision.via, now)
        if attempt.refused is not None:
            return attempt.refused
        return "repaired" if attempt.stood else "changed"

    async def _big(self, key: bytes, decision: Decision, states: Sequence[KeyState]) -> bool:
        """A copy of a collection above `page_elements`, every lane reached directly."""
        if self.pages is None or decision.action != "copy" or decision.winner is None:
            return False
        if any(lane.remote is not None for lane in self.lanes):
            return False
        winner = decision.winner
        return await is_big(self.lanes[winner], key, states[winner], self.page_elements)

    async def _repair_big(
        self, key: bytes, decision: Decision, states: Sequence[KeyState]
    ) -> Outcome:
        assert self.pages is not None and decision.winner is not None
        # A replication group's copy is made on its primary only (whose own value, when it
        # already holds it, is copied onto itself: the pages and the swap replicate).
        targets = (decision.via,) if decision.via is not None else decision.targets
        outcome = await repair_big_key(
            self.lanes, key, decision.winner, targets, states, self.pages
        )
        if outcome == "undo_failed":
            self.undo_failed.append(key)
            return "changed"
        return outcome

    async def _attempt(
        self, key: bytes, decision: Decision, states: Sequence[KeyState]
    ) -> _Attempt | None:
        """Write every target (steps 1 and 2); None if the winner changed first."""
        if decision.via is not None:
            return await self._attempt_via(key, decision, states)
        if decision.action == "delete":
            now = time.monotonic()
            results = await all_of(
                _refusal_kept(self._write, t, key, states[t], Write("delete"), now)
                for t in decision.targets
            )
            return _attempt(key, ABSENT, results)
        assert decision.winner is not None
        winner_state = states[decision.winner]
        source = await self._read_winner(decision.winner, key, winner_state)
        if source is None:
            return None
        payload, pttl, read_at, data = source
        results = await all_of(
            _refusal_kept(
                self._copy,
                t,
                key,
                states[t],
                decision.winner,
                winner_state,
                payload,
                pttl,
                read_at,
            )
            for t in decision.targets
        )
        attempt = _attempt(key, winner_state, results)
        attempt.expected_data = data
        return attempt

    async def _attempt_via(
        self, key: bytes, decision: Decision, states: Sequence[KeyState]
    ) -> _Attempt | None:
        """Steps 1 and 2 in a replication group: one write, on the primary `via`, which
        replication carries to the targets; it stands when every member but those `left`
        (not following the primary) holds the decided state."""
        via = decision.via
        assert via is not None
        check = tuple(i for i in range(len(self.lanes)) if i not in decision.left)
        if decision.action == "delete":
            write = Write("delete") if states[via].exists else Write("purge")
            result = await _refusal_kept(
                self._write, via, key, states[via], write, time.monotonic()
            )
            return replace(_attempt(key, ABSENT, [result]), check=check)
        assert decision.winner is not None
        winner_state = states[decision.winner]
        source = await self._read_winner(decision.winner, key, winner_state)
        if source is None:
            return None
        payload, pttl, read_at, data = source
        reasserted = via not in decision.targets
        if not reasserted:
            result = await _refusal_kept(
                self._copy,
                via,
                key,
                states[via],
                decision.winner,
                winner_state,
                payload,
                pttl,
                read_at,
            )
        else:
            # The primary holds the state already: written again, as RESTORE of its own
            # DUMP (a no-op write such as PERSIST of a persistent key replicates nothing).
            again = Write("restore", payload, pttl)
            result = await _refusal_kept(self._write, via, key, states[via], again, read_at)
        attempt = _attempt(key, winner_state, [result])
        attempt.expected_data = data
        return replace(attempt, check=check, undo=not reasserted)

    def _note_unfollowed(
        self, attempt: _Attempt, via: int, now: list[dict[bytes, KeyState]]
    ) -> None:
        """The primary holds what was written, some replicas do not: remember which."""
        key, expected = attempt.key, attempt.expected
        if not now[via][key].same_as(expected, self.tolerance_ms):
            return  # the primary moved: a client's write, rechecked as any change
        behind = [
            self.lanes[i].name
            for i in attempt.check or range(len(self.lanes))
            if not now[i][key].same_as(expected, self.tolerance_ms)
        ]
        if behind:
            self.unfollowed[key] = behind

    async def _observe(self, keys: Sequence[bytes]) -> list[dict[bytes, KeyState]]:
        async def one(lane: ReplicaLane) -> dict[bytes, KeyState]:
            if lane.remote is not None:
                async with lane.turn():
                    return await lane.remote.observe(keys)
            async with lane.connection() as conn:
                return await observe_keys(conn, keys, chunk=self.chunk, keep=False)

        return await all_of(one(lane) for lane in self.lanes)

    async def _settle(self, attempt: _Attempt, now: list[dict[bytes, KeyState]]) -> None:
        """Step 3: keep the writes if every replica holds the winner's state, else undo them."""
        checked = now if attempt.check is None else [now[i] for i in attempt.check]
        if attempt.complete and all(
            reads[attempt.key].same_as(attempt.expected, self.tolerance_ms) for reads in checked
        ):
            attempt.stood = True
            return
        if attempt.undo:
            await all_of(self._undo(attempt, w) for w in attempt.written)

    async def _undo(self, attempt: _Attempt, written: _Written) -> None:
        """Put one target back (`undo.undo`); a key that keeps moving is retried a few
        times, then counted as not undone and named in the log."""
        lane = self.lanes[written.target]
        if lane.remote is not None:
            # Through an agent: the compare-and-set restore of the pre-image only. A copy
            # a client deleted or overwrote since is left to that write; one changed in
            # place cannot be merged there, so it is reported, never guessed.
            before = written.before
            put_back = Write("undo", before.dump, before.pttl)
            if await self._write(
                written.target, attempt.key, attempt.expected, put_back, before.at
            ):
                self.undone += 1
                return
            async with lane.turn():
                now = (await lane.remote.observe([attempt.key]))[attempt.key]
            if not overwritten(now, attempt.expected):
                self._not_undone(lane, attempt.key)
            return
        for attempt_no in range(3):
            if attempt_no:
                await asyncio.sleep(self.settle_s / 2)
            async with lane.connection(write=True) as conn:
                outcome = await undo(
                    conn,
                    attempt.key,
                    wrote=attempt.expected,
                    wrote_data=attempt.expected_data,
                    before=written.before,
                    tolerance_ms=self.tolerance_ms,
                    chunk=self.chunk,
                )
            if outcome in ("restored", "merged"):
                lane.writes += 1
                self.undone += 1
                return
            if outcome == "client_wrote":
                return
        self._not_undone(lane, attempt.key)

    def _not_undone(self, lane: ReplicaLane, key: bytes) -> None:
        self.undo_failed.append(key)
        logger.warning(
            "%s: %r: the repair's copy could not be undone (a client changed it in place "
            "before it was verified); check this key",
            lane.name,
            key,
        )

    async def _read_winner(
        self, index: int, key: bytes, expected: KeyState
    ) -> tuple[bytes, int, float, Data | None] | None:
        """Step 1: the winner's DUMP and PTTL if it still holds `expected`, and (read here,
        not through an agent) a small collection's elements to merge an undo with, all
        of one moment."""
        lane = self.lanes[index]
        data: Data | None = None
        if lane.remote is not None:
            async with lane.turn():
                read = await lane.remote.read_for_copy(key, expected, self.tolerance_ms)
        else:
            async with lane.connection() as conn:
                read, data = await read_for_copy_with_data(
                    conn, key, expected, tolerance_ms=self.tolerance_ms, chunk=self.chunk
                )
        return None if read is None else (read[0], read[1], time.monotonic(), data)

    async def _copy(
        self,
        target: int,
        key: bytes,
        expected: KeyState,
        winner_index: int,
        winner: KeyState,
        payload: bytes,
        pttl: int,
        read_at: float,
    ) -> _Written | None:
        if expected.exists and expected.same_value(winner):
            # Only the expiry differs: leave the value alone.
            return await self._write(target, key, expected, Write("expire", None, pttl), read_at)
        try:
            return await self._write(
                target, key, expected, Write("restore", payload, pttl), read_at
            )
        except EndpointError as exc:
            if (
                "payload" not in exc.message.lower()
                or self.lanes[target].remote is not None
                or self.lanes[winner_index].remote is not None
            ):
                raise

        # The target cannot read the winner's DUMP format (an older server):
        # rebuild the value with type-specific writes, still under WATCH.
        whole = await self._winner_value(winner_index, key, winner)
        if whole is None:
            return None

        def typed() -> list[bytes] | None:
            expiry = Write("expire", None, pttl).commands(key, _elapsed_ms(read_at))
            if expiry is None:
                return None  # the winner has expired meanwhile
            return _typed_writes(key, whole) + (expiry if pttl >= 0 else [])

        return await self._write(target, key, expected, typed, read_at)

    async def _winner_value(self, index: int, key: bytes, expected: KeyState) -> KeyState | None:
        """The winner's whole value for type-specific writes, read again (on this rare
        path memory grows with the value); None if it no longer has the decided digest."""
        assert expected.type is not None
        async with self.lanes[index].connection() as conn:
            reads = await read_values(conn, [(key, expected.type)], chunk=self.chunk, keep=True)
        read = reads[key]
        if read is None or read.digest != expected.digest:
            return None
        return KeyState(True, read.type, read.digest, expected.expiry_ms, read.data)

    async def _write(
        self,
        target: int,
        key: bytes,
        expected: KeyState,
        write: Write | Callable[[], list[bytes] | None],
        since: float,
    ) -> _Written | None:
        """Step 2 on lane `target` (here, or through its agent); None if nothing was written.
        TTLs in `write` count from `since` (monotonic) to the moment of writing, so waiting
        for the rate limiter never stretches a copy's life."""
        lane = self.lanes[target]
        if lane.remote is not None:
            if not isinstance(write, Write):
                raise EndpointError(
                    "typed writes (for a server that refuses the winner's DUMP) are not sent "
                    "through agents",
                    where=lane.name,
                )
            async with lane.turn(write=True):
                done = await lane.remote.write(
                    key, expected, write, _elapsed_ms(since), self.tolerance_ms
                )
        else:
            commands: Callable[[], list[bytes] | None] = (
                (lambda: write.commands(key, _elapsed_ms(since)))
                if isinstance(write, Write)
                else write
            )
            async with lane.connection(write=True) as conn:
                done = await compare_and_write(
                    conn, key, expected, commands, tolerance_ms=self.tolerance_ms, chunk=self.chunk
                )
        if done is None:
            return None
        pre_image, pre_pttl, count = done
        lane.writes += count
        # WATCH made the pre-image the compared state, so its type is `expected`'s.
        pre_type = expected.type if pre_image is not None else None
        return _Written(target, PreImage(pre_type, pre_image, pre_pttl, time.monotonic()))


def _elapsed_ms(since: float) -> int:
    return int((time.monotonic() - since) * 1000)


async def _refusal_kept(
    write: Callable[..., Awaitable[_Written | None]], *args: Any
) -> _Written | Refused | None:
    """`write(*args)`, a target's write; its refusal as a value, so the other targets'
    writes are still re-verified (and undone) with it. (The coroutine is made here: one
    made by the caller would never be awaited if this task were cancelled first.)"""
    try:
        return await write(*args)
    except KeyRefused as exc:
        return Refused(exc.where or "?", exc.message)


def _attempt(
    key: bytes, expected: KeyState, results: Sequence[_Written | Refused | None]
) -> _Attempt:
    written = [w for w in results if isinstance(w, _Written)]
    refused = next((r for r in results if isinstance(r, Refused)), None)
    return _Attempt(key, expected, written, complete=len(written) == len(results), refused=refused)
