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
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from replag.errors import EndpointError, KeyRefused
from replag.repair.decisions.policy import Decision
from replag.repair.keyspace.faithful import require_whole_copy
from replag.repair.keyspace.field_ttls import same_field_expiries
from replag.repair.keyspace.observe import ABSENT, KeyState
from replag.repair.keyspace.pages import PageOptions, copied_in_pages, repair_big_key
from replag.repair.keyspace.together import all_of
from replag.repair.keyspace.values import Data
from replag.repair.keyspace.write import Write
from replag.repair.writes.guarded_write import (
    CHUNK,
    TYPED_WRITES,
    Refused,
    cannot_restore,
    compare_and_write,
    elapsed_ms,
    raise_refusal,
    read_for_copy,
    read_for_copy_with_data,
    typed_writes,
)
from replag.repair.writes.lanes import BusyClock, RateLimiter, RemoteReplica, ReplicaLane
from replag.repair.writes.undo import PreImage

# Where these lived before apply.py was split; other modules import them from here still.
__all__ = [
    "Applier",
    "BusyClock",
    "Outcome",
    "RateLimiter",
    "Refused",
    "RemoteReplica",
    "ReplicaLane",
    "Write",
    "compare_and_write",
    "raise_refusal",
    "read_for_copy",
    "read_for_copy_with_data",
]

Outcome = Literal["repaired", "changed", "dry_run"] | Refused
logger = logging.getLogger(__name__)


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
        chunk: int = CHUNK,
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
        return await copied_in_pages(self.lanes[winner], key, states[winner], self.page_elements)

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
        return await all_of(lane.observe(keys, chunk=self.chunk) for lane in self.lanes)

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
        """Put one target back; one that could not be is counted and named in the log."""
        lane = self.lanes[written.target]
        put_back = await lane.put_back(
            attempt.key,
            wrote=attempt.expected,
            wrote_data=attempt.expected_data,
            before=written.before,
            retry_s=self.settle_s / 2,
            tolerance_ms=self.tolerance_ms,
            chunk=self.chunk,
        )
        if put_back:
            self.undone += 1
        elif put_back is False:
            self.undo_failed.append(attempt.key)
            logger.warning(
                "%s: %r: the repair's copy could not be undone (a client changed it in place "
                "before it was verified); check this key",
                lane.name,
                attempt.key,
            )

    async def _read_winner(
        self, index: int, key: bytes, expected: KeyState
    ) -> tuple[bytes, int, float, Data | None] | None:
        """Step 1 (`ReplicaLane.read_for_copy`)."""
        return await self.lanes[index].read_for_copy(
            key, expected, tolerance_ms=self.tolerance_ms, chunk=self.chunk
        )

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
        if (
            expected.exists
            and expected.same_value(winner)
            and same_field_expiries(expected.field_expiries, winner.field_expiries, 0)
        ):
            # Only the key's expiry differs: leave the value alone (a hash whose fields'
            # TTLs differ is copied whole: they are part of its value).
            return await self._write(target, key, expected, Write("expire", None, pttl), read_at)
        try:
            return await self._write(
                target, key, expected, Write("restore", payload, pttl), read_at
            )
        except EndpointError as exc:
            if winner.type not in TYPED_WRITES:
                raise KeyRefused(
                    cannot_restore(key, str(winner.type), exc.message), where=exc.where
                ) from exc
            if (
                "payload" not in exc.message.lower()
                or self.lanes[target].remote is not None
                or self.lanes[winner_index].remote is not None
            ):
                raise

        # The target cannot read the winner's DUMP format (an older server):
        # rebuild the value with type-specific writes, still under WATCH.
        whole = await self.lanes[winner_index].read_whole(key, winner, chunk=self.chunk)
        if whole is None:
            return None
        async with self.lanes[target].connection() as conn:
            await require_whole_copy(conn, key, whole)  # field TTLs a target cannot keep

        def typed() -> list[bytes] | None:
            expiry = Write("expire", None, pttl).commands(key, elapsed_ms(read_at))
            if expiry is None:
                return None  # the winner has expired meanwhile
            return typed_writes(key, whole) + (expiry if pttl >= 0 else [])

        return await self._write(target, key, expected, typed, read_at)

    async def _write(
        self,
        target: int,
        key: bytes,
        expected: KeyState,
        write: Write | Callable[[], list[bytes] | None],
        since: float,
    ) -> _Written | None:
        """Step 2 on lane `target` (`ReplicaLane.write`); None if nothing was written."""
        before = await self.lanes[target].write(
            key, expected, write, since, tolerance_ms=self.tolerance_ms, chunk=self.chunk
        )
        return None if before is None else _Written(target, before)


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
