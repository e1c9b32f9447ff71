"""Redis Cluster: each shard's key count per slot, its primary against its replicas.

Valkey 8+ and Redis 8.2+ answer `CLUSTER SLOT-STATS` with every slot's key count in
one call (`replag.wire.slot_stats`). A replica that missed writes (or deletions), or
took writes of its own, holds a different count than its primary in those slots: a
near-free signal, named per replica in the check's report (`slot_counts`) and in
the service's gauges (`replag_slot_count_*`, per group and replica: never a series
per slot).

Counts are compared at one point of the replication stream where the host allows:
the primary's counts and offset are read in one transaction, the replica is waited
for (up to CATCH_UP_S) until it has applied that offset, then read the same way. If
its offset is then the primary's, nothing was in flight and the comparison is exact
(`exact`). Under writes it is not: the comparison is read a second time and a slot
is named only if it differed by the same amount both times (`unconfirmed` counts the
others). Slots that moved during the check, or that one end does not serve, are left
out.

What it does not do: equal counts do not prove equal content (a replica that misses
one key of a slot and holds another there, or holds a stale value, counts the same),
so the check still reads every slot; a difference here is a signal the check's own
comparison explains key by key, never a finding by itself. Slots a shard does not
serve are not listed by the command: keys left there are `stray_slots`' to count.
A server without the command (Redis 7, 6.2; Valkey 7) is skipped, said once a run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replag.errors import EndpointError, PermissionRefused
from replag.repair.keyspace.slots import ranges
from replag.topology import Endpoint
from replag.wire.resp import RespConnection
from replag.wire.slot_stats import SlotCounts, read_counts

logger = logging.getLogger(__name__)

EXAMPLES = 10  # slots named per replica, with both counts
CATCH_UP_S = 5.0  # the longest a replica is waited for to apply its primary's offset


@dataclass
class _Compared:
    diffs: dict[int, int]  # slot -> replica's count minus the primary's
    exact: bool
    primary: dict[int, int]
    replica: dict[int, int]


@dataclass
class SlotCountCheck:
    """One shard's comparison (see the module docstring). `missing`: why nothing was
    compared (the server lacks the command, or the ACL user may not run it: optional,
    the check's verdict does not depend on it)."""

    primary: Endpoint
    replicas: Sequence[Endpoint]
    timeout_s: float
    missing: str | None = None
    reads: int = 0  # CLUSTER SLOT-STATS calls made

    async def compare(self, skip: set[int] | frozenset[int] = frozenset()) -> list[dict[str, Any]]:
        """One row per replica compared: member, primary, slots_differing, key_difference
        (the sum of the differences' sizes), replica_minus_primary, slots (ranges),
        examples ({slot, primary, replica}), exact, unconfirmed."""
        rows: list[dict[str, Any]] = []
        for replica in self.replicas:
            first = await self._compare(replica, skip)
            if first is None:
                if self.missing is not None:
                    return []
                continue
            unconfirmed = 0
            found = first
            if first.diffs and not first.exact:
                second = await self._compare(replica, skip)
                if second is None:
                    continue
                if second.exact:
                    found = second
                else:
                    same = {s: d for s, d in second.diffs.items() if first.diffs.get(s) == d}
                    unconfirmed = len(set(first.diffs) | set(second.diffs)) - len(same)
                    found = _Compared(same, False, second.primary, second.replica)
            rows.append(self._row(replica, found, unconfirmed))
        return rows

    def _row(self, replica: Endpoint, found: _Compared, unconfirmed: int) -> dict[str, Any]:
        slots = sorted(found.diffs)
        return {
            "member": replica.name,
            "primary": self.primary.name,
            "slots_differing": len(slots),
            "key_difference": sum(abs(d) for d in found.diffs.values()),
            "replica_minus_primary": sum(found.diffs.values()),
            "slots": [list(r) for r in ranges(slots)],
            "examples": [
                {"slot": s, "primary": found.primary.get(s, 0), "replica": found.replica.get(s, 0)}
                for s in sorted(slots, key=lambda s: (-abs(found.diffs[s]), s))[:EXAMPLES]
            ],
            "exact": found.exact,
            "unconfirmed": unconfirmed,
        }

    async def _compare(
        self, replica: Endpoint, skip: set[int] | frozenset[int]
    ) -> _Compared | None:
        primary = await self._read(self.primary, replica=False)
        if primary is None:
            return None
        if primary.offset is not None:
            await self._catch_up(replica, primary.offset)
        mine = await self._read(replica, replica=True)
        if mine is None:
            return None
        common = (primary.counts.keys() & mine.counts.keys()) - skip
        diffs = {s: mine.counts[s] - primary.counts[s] for s in common}
        return _Compared(
            {s: d for s, d in diffs.items() if d},
            exact=primary.offset is not None and primary.offset == mine.offset,
            primary=primary.counts,
            replica=mine.counts,
        )

    async def _read(self, member: Endpoint, *, replica: bool) -> SlotCounts | None:
        if self.missing is not None:
            return None
        try:
            conn = await RespConnection.open(member, timeout_s=self.timeout_s)
        except EndpointError as exc:
            logger.warning("%s: slot counts not read: %s", member.name, exc)
            return None
        try:
            got = await read_counts(conn, replica=replica)
        except PermissionRefused as exc:
            self.missing = f"refused: {exc}"
            return None
        except EndpointError as exc:
            logger.warning("%s: slot counts not read: %s", member.name, exc)
            return None
        finally:
            await conn.close()
        self.reads += 1
        if got.missing is not None:
            self.missing = (
                "the server has no CLUSTER SLOT-STATS (Valkey 8+ and Redis 8.2+ have it): "
                f"{member.name} answered {got.missing!r}"
            )
            return None
        return got

    async def _catch_up(self, replica: Endpoint, offset: int) -> None:
        """Until `replica` has applied its primary's stream up to `offset` (or CATCH_UP_S:
        a replica that lags more is compared as it is, and not exactly)."""
        deadline = time.monotonic() + CATCH_UP_S
        try:
            conn = await RespConnection.open(replica, timeout_s=self.timeout_s)
        except EndpointError:
            return
        try:
            while time.monotonic() < deadline:
                info = await conn.checked(b"INFO", b"replication")
                done = _applied(info)
                if done is None or done >= offset:
                    return
                await asyncio.sleep(0.002)
        except EndpointError:
            return
        finally:
            await conn.close()


def _applied(info: Any) -> int | None:
    if not isinstance(info, bytes):
        return None
    for line in info.splitlines():
        if line.startswith(b"slave_repl_offset:"):
            value = line.split(b":", 1)[1].strip()
            return int(value) if value.lstrip(b"-").isdigit() else None
    return None
