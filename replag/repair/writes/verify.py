"""Verification: each candidate key read on every member twice, `repair_settle` apart.

A key that differs at both reads and did not change between them is divergent;
one that changed is being written (rechecked later, never repaired on a guess).
Reads go to the member here, or, for a member whose region runs an agent, to
that agent (both reads made there, one round trip).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from replag.errors import AgentError
from replag.repair.decisions.not_compared import NotCompared, uncompared
from replag.repair.decisions.policy import Newest, Policy
from replag.repair.keyspace.observe import KeyState, observe_keys
from replag.repair.keyspace.progress import ProgressCallback, RepairProgress
from replag.repair.keyspace.slots import key_slot
from replag.repair.keyspace.together import all_of, cancel_all
from replag.repair.trees.diff import Divergence, Kind, classify
from replag.repair.trees.remote import AgentClient
from replag.repair.writes.lanes import ReplicaLane

VERIFY_BATCH = 256
# Through an agent a batch costs a WAN round trip; a key's two states are ~100 bytes.
AGENT_VERIFY_BATCH = 4096
# Verification batches read at once: their waits of `repair_settle` overlap.
VERIFY_IN_FLIGHT = 4
# A key whose replicas changed between the two reads, with how they differed at the
# second (None: they agreed then).
Changing = tuple[bytes, Divergence | None]
# Every member's reads of a batch of keys, twice.
_Reads = tuple[list[dict[bytes, KeyState]], list[dict[bytes, KeyState]]]


class Verifier:
    """Reads keys on every member of a group (`lanes`, `agents` by member) and judges them."""

    def __init__(
        self,
        *,
        group: str,
        names: list[str],
        lanes: Sequence[ReplicaLane],
        agents: Sequence[AgentClient | None],
        policy: Policy,
        settle_s: float,
        chunk: int,
        tolerance_ms: int,
        compare_ttls: bool,
        progress: ProgressCallback | None,
        not_compared: Callable[[AgentError], AgentError],
    ) -> None:
        self.group, self.names, self.lanes, self.agents = group, names, lanes, agents
        self.policy, self.settle_s, self.chunk = policy, settle_s, chunk
        self.tolerance_ms, self.compare_ttls = tolerance_ms, compare_ttls
        self.progress, self.not_compared = progress, not_compared
        # Cluster slots of keys a member answered MOVED or ASK for: not compared.
        self.moved_slots: set[int] = set()
        # Keys every member holds as a value replag cannot read (a module type), tallied
        # by the first verification of a run's candidates ("verify"), not by its rechecks.
        self.opaque_keys = NotCompared()

    @property
    def stamp_fields(self) -> tuple[bytes, ...]:
        """newest:FIELD decides on one hash field: read just that, not the whole hash."""
        return (self.policy.field.encode(),) if isinstance(self.policy, Newest) else ()

    async def observe(self, i: int, keys: Sequence[bytes]) -> dict[bytes, KeyState]:
        """One read of `keys` on member `i`: here, or by its agent."""
        client, lane = self.agents[i], self.lanes[i]
        if client is not None:
            return await client.observe_once(lane.name, keys, **self.agent_reads)
        async with lane.connection() as conn:
            return await observe_keys(conn, keys, chunk=self.chunk, fields=self.stamp_fields)

    @property
    def agent_reads(self) -> dict[str, Any]:
        # What an agent sends back besides type, digest and expiry: a newest:FIELD policy
        # needs string values (JSON timestamps) and the field of hashes; nothing else does.
        newest = isinstance(self.policy, Newest)
        return {"keep": newest, "fields": self.stamp_fields}

    async def observe_all(self, keys: Sequence[bytes]) -> list[dict[bytes, KeyState]]:
        """One read of `keys` on every member."""
        try:
            reads = await all_of(self.observe(i, keys) for i in range(len(self.lanes)))
        except AgentError as exc:
            raise self.not_compared(exc) from exc
        return list(reads)

    async def observe_twice(
        self, keys: Sequence[bytes]
    ) -> tuple[list[dict[bytes, KeyState]], list[dict[bytes, KeyState]]]:
        """Every member's reads of `keys`, twice, `settle_s` apart: through a member's agent
        (both reads in its region, one round trip), else here."""

        async def one(i: int) -> tuple[dict[bytes, KeyState], dict[bytes, KeyState]]:
            client, lane = self.agents[i], self.lanes[i]
            if client is not None:
                return await client.observe_twice(
                    lane.name, keys, self.settle_s, **self.agent_reads
                )
            first = await self.observe(i, keys)
            await asyncio.sleep(self.settle_s)
            return first, await self.observe(i, keys)

        try:
            pairs = await all_of(one(i) for i in range(len(self.lanes)))
        except AgentError as exc:
            raise self.not_compared(exc) from exc
        return [p[0] for p in pairs], [p[1] for p in pairs]

    async def verify(
        self,
        keys: Sequence[bytes],
        *,
        phase: str,
        on_batch: Callable[[list[Divergence], list[Changing]], None] | None = None,
    ) -> tuple[list[Divergence], list[Changing]]:
        """Divergent keys (stable over two reads `settle_s` apart) and keys still changing,
        each with how it differed at the second read (None: the replicas agreed then).
        `on_batch(divergent, changing)` is called with each batch's share, in order.

        Up to `VERIFY_IN_FLIGHT` batches are read at once, so their waits between the
        two reads overlap instead of adding up."""
        divergent: list[Divergence] = []
        changing: list[Changing] = []
        started = time.perf_counter()
        size = AGENT_VERIFY_BATCH if any(self.agents) else VERIFY_BATCH
        batches = [keys[start : start + size] for start in range(0, len(keys), size)]
        reads: deque[asyncio.Future[_Reads]] = deque()
        done = 0
        try:
            for i, batch in enumerate(batches):
                while len(reads) < VERIFY_IN_FLIGHT and i + len(reads) < len(batches):
                    upcoming = batches[i + len(reads)]
                    reads.append(asyncio.ensure_future(self.observe_twice(upcoming)))
                first, second = await reads.popleft()
                found_before, changing_before = len(divergent), len(changing)
                self.judge(batch, first, second, divergent, changing, tally=phase == "verify")
                if on_batch is not None:
                    on_batch(divergent[found_before:], changing[changing_before:])
                done += len(batch)
                if self.progress is not None:
                    elapsed = time.perf_counter() - started
                    rate = done / elapsed if elapsed > 0 else 0.0
                    self.progress(RepairProgress(self.group, "*", phase, done, len(keys), rate))
        finally:
            await cancel_all(reads)
        return divergent, changing

    def judge(
        self,
        batch: Sequence[bytes],
        first: list[dict[bytes, KeyState]],
        second: list[dict[bytes, KeyState]],
        divergent: list[Divergence],
        changing: list[Changing],
        *,
        tally: bool = False,
    ) -> None:
        """Sort a batch read twice into `divergent` and `changing`; with `tally`, keys whose
        values cannot be compared into `not_compared` too (their expiries still are)."""
        now_ms = time.time_ns() // 1_000_000
        for key in batch:
            states = [reads[key] for reads in second]
            if any(s.moved for s in states) or any(reads[key].moved for reads in first):
                self.moved_slots.add(key_slot(key))  # served elsewhere now: not compared
                continue
            stable = all(
                self._same(a[key], b) and b.readable for a, b in zip(first, states, strict=True)
            )
            kind = self.classify(states, now_ms) if all(s.readable for s in states) else "value"
            found = (
                Divergence(key, kind, dict(zip(self.names, states, strict=True)), self.tolerance_ms)
                if kind is not None
                else None
            )
            if not stable:
                changing.append((key, found))
                continue
            if found is not None:
                divergent.append(found)
            if tally and (opaque := uncompared(states)) is not None:
                self.opaque_keys.add(key, opaque)

    def _same(self, a: KeyState, b: KeyState) -> bool:
        if self.compare_ttls:
            return a.same_as(b, self.tolerance_ms)
        return a.same_value(b)

    def classify(self, states: Sequence[KeyState], now_ms: int) -> Kind | None:
        return classify(
            states, tolerance_ms=self.tolerance_ms, now_ms=now_ms, ttls=self.compare_ttls
        )
