"""A `repair run` that finds one member of a peer group wiped or nearly empty refills it the
rebuild's way first, then verifies only what that copy could not prove.

Checking first (every member scanned into a tree, the trees walked, then the missing
keys refilled) reads the whole keyspace twice; the rebuild's copy reads it once. Before
anything is scanned, each member's DBSIZE is read: when exactly one holds less than
1/`EMPTY_SHARE` of the largest member's keys, the policy would copy a key only it lacks
(`bulk.copy.bulk_allowed`), and it is no Redis replica, the run copies it from its peers
with the rebuild's job (`bulk.rebuild_copy.Rebuild`: a key is written only where the
peers agree on it and the target lacks it, and verified `repair_settle` later). What the
copy leaves is what the rebuild's closing pass looks at (handed back, only on other
peers), and, when the member held keys before, the keys only it holds: those go through
the run's key-by-key verify and repair, so the run ends where a full check would.
When they are more than a third of the source's keys, or the copy resumed after a crash
(it no longer knows them), the run scans and checks every member as usual.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from replag.repair.bulk.closing import keys_elsewhere, writes_seen
from replag.repair.bulk.copy import BULK_MIN, bulk_allowed
from replag.repair.bulk.rebuild_copy import WHOLE_PASS_SHARE, Rebuild, RebuildOptions
from replag.repair.bulk.rebuild_log import RebuildLog
from replag.repair.decisions.policy import Policy
from replag.repair.decisions.replica_role import replica_of
from replag.repair.keyspace.progress import ProgressCallback
from replag.repair.keyspace.together import all_of
from replag.topology import ReplicaGroup

logger = logging.getLogger(__name__)

# A member holding fewer than 1/EMPTY_SHARE of the largest member's keys is refilled first.
EMPTY_SHARE = 10


@dataclass(frozen=True, kw_only=True)
class WipedMember:
    """The member found nearly empty (its index in the group) and the key counts read."""

    index: int
    keys: int
    largest: int


@dataclass(frozen=True, kw_only=True)
class WipedRefill:
    """What refilling the wiped member did and left."""

    source: str
    copied: int  # keys copied and verified (missing on the target, repaired)
    read: int  # keys the source's scan returned
    seconds: float
    # What is left to verify; None: the copy cannot say (resumed, or too many), check all.
    left: list[bytes] | None


async def find_wiped(
    group: ReplicaGroup, policy: Policy, *, allow_deletes: bool, timeout_s: float
) -> WipedMember | None:
    """The one member the rebuild's copy should refill before the run checks, if any."""
    sizes = [size for _, size in await all_of(writes_seen(m, timeout_s) for m in group.members)]
    largest = max(sizes)
    if largest < BULK_MIN:
        return None  # the scan is cheap, and the bulk path needs as many keys
    small = [i for i, size in enumerate(sizes) if size * EMPTY_SHARE < largest]
    if len(small) != 1:
        return None  # two members empty: the peers of either disagree on every key
    t = small[0]
    if not bulk_allowed(policy, t, len(sizes), allow_deletes=allow_deletes):
        return None
    if await replica_of(group.members[t], timeout_s) is not None:
        return None  # refused writes: its primary's sync refills it
    return WipedMember(index=t, keys=sizes[t], largest=largest)


async def refill_wiped(
    options: RebuildOptions,
    group: ReplicaGroup,
    wiped: WipedMember,
    *,
    rate: float | None,
    log: RebuildLog | None,
    progress: ProgressCallback | None,
) -> WipedRefill:
    """Copy the wiped member from its peers (`Rebuild.run`, checkpointed in `log`); what
    the copy leaves to verify (see the module docstring)."""
    target = group.members[wiped.index]
    job = Rebuild(options, group, target, None, rate=rate, progress=progress)
    plan = await job.plan(sample_s=None)
    seconds = await job.run(log, plan)
    try:
        left = await job.closing_keys()
        if left is not None and wiped.keys:
            # Keys only the target held before the copy: a check would find them too.
            own = await keys_elsewhere(
                [target], job.source_keys, prefix=job.prefix, timeout_s=job.timeout_s
            )
            left = sorted({*left, *own})
    finally:
        job.source_keys.close()
    if left is not None and len(left) > plan.source_keys // WHOLE_PASS_SHARE:
        left = None
    copied = job.counts.copied + job.big_copied
    logger.info(
        "group %s: %s held %d keys of the largest member's %d: refilled from %s first "
        "(%d keys copied in %.1f s); %s",
        group.name,
        target.name,
        wiped.keys,
        wiped.largest,
        plan.source,
        copied,
        seconds,
        "every key is checked now" if left is None else f"{len(left)} keys left to verify",
    )
    return WipedRefill(
        source=plan.source, copied=copied, read=job.counts.keys, seconds=seconds, left=left
    )
