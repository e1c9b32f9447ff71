"""The bulk path of `repair run`, and what it shares with `rebuild`: which keys a member
lacks that its peers agree on, batches copied several at a time, and settling batches a
crash left unverified.

After the scans a run knows, for every key in a differing leaf, each member's entry
hash (type, digest, expiry bucket). A key that one member lacks and every other member
holds with one entry is exactly what `refill.Refill` copies safely without reading the
target first. When a member lacks at least `BULK_MIN` such keys (a wiped or replaced
replica, a lost key range), the run copies them in bulk before anything else, and only
the keys the refill hands back (present by then, disagreed on, moved, big and not
copied) go through the key-by-key verify-and-repair path.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from replag.repair.bulk.rebuild_log import RebuildLog
from replag.repair.bulk.refill import BATCH, IN_FLIGHT, BatchResult, Refill
from replag.repair.decisions.policy import Majority, Policy, Quorum, Source
from replag.repair.decisions.replica_role import replica_of
from replag.repair.keyspace.observe import KeyState, observe_keys
from replag.repair.keyspace.pages import PageOptions, copy_big_keys
from replag.repair.keyspace.together import all_of, cancel_all
from replag.repair.trees.index import ScanIndex
from replag.settings import Settings
from replag.store import Store
from replag.topology import Endpoint, ReplicaGroup
from replag.wire.resp import RespConnection, pack

if TYPE_CHECKING:
    from replag.repair.keyspace.progress import ProgressCallback

BULK_MIN = 1000
_Tag = TypeVar("_Tag")


def refill_plan(parts: Sequence[ScanIndex]) -> dict[int, list[bytes]]:
    """Per member index, the keys of `parts` (each member's keys of the same leaves) that
    it alone lacks while every other member holds them with one entry hash, sorted."""
    n = len(parts)
    if n < 2 or not sum(len(p) for p in parts):
        return {}
    hashes = np.concatenate([p.key_hashes for p in parts])
    owner = np.concatenate([np.full(len(p), i, np.int64) for i, p in enumerate(parts)])
    row = np.concatenate([np.arange(len(p), dtype=np.int64) for p in parts])
    entries = np.concatenate([p.entries for p in parts])
    unique, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    held = np.zeros(len(unique), np.int64)
    np.bitwise_or.at(held, inverse, np.left_shift(1, owner))
    smallest = np.full(len(unique), np.iinfo(np.uint64).max, np.uint64)
    largest = np.zeros(len(unique), np.uint64)
    np.minimum.at(smallest, inverse, entries)
    np.maximum.at(largest, inverse, entries)
    agree = smallest == largest
    everyone = (1 << n) - 1
    plan: dict[int, list[bytes]] = {}
    for t in range(n):
        picked = np.flatnonzero(agree & (held == everyone ^ (1 << t)))
        if len(picked):
            plan[t] = sorted(parts[int(owner[first[d]])].key(int(row[first[d]])) for d in picked)
    return plan


def bulk_allowed(policy: Policy, target: int, members: int, *, allow_deletes: bool) -> bool:
    """Whether the policy copies a key that only `target` lacks from the others: quorum
    does (unless deletes are allowed and the one absent member is a majority), a source
    policy does for any target but its source; majority does with 3+ members while the
    probes saw at most one of them cut off; `newest` decides on values, so never."""
    if isinstance(policy, Majority):
        return 2 * (members - 1) > members and len(policy.cut_off) <= 1
    if isinstance(policy, Quorum):
        absent = 1
        return not (allow_deletes and 2 * absent > members)
    if isinstance(policy, Source):
        return policy.index != target
    if isinstance(policy, Majority):
        # One rack of three or more lacking a key the others hold: a copy, unless the
        # probes saw several racks cut off (then every such key is a conflict).
        return members >= 3 and len(policy.cut_off) <= 1
    return False


async def copy_batches(
    refill: Refill,
    batches: AsyncIterator[tuple[list[bytes], _Tag]],
    *,
    on_done: Callable[[BatchResult, _Tag], Awaitable[None]],
    rate: float | None = None,
    log: RebuildLog | None = None,
    in_flight: int = IN_FLIGHT,
) -> None:
    """Copy every batch, `in_flight` at a time, paced at `rate` keys/s; `on_done(result,
    tag)` in the batches' order. With `log`, each batch's keys are saved before it is
    written and dropped once it is verified (`settle_pending` after a crash)."""
    started = time.monotonic()
    sent = 0
    number = 0
    pending: deque[tuple[int, _Tag, asyncio.Future[BatchResult]]] = deque()
    try:
        async for keys, tag in batches:
            if rate:
                await asyncio.sleep(max(0.0, started + sent / rate - time.monotonic()))
            sent += len(keys)
            number += 1
            if log is not None and keys:
                log.add_pending(number, keys)
            pending.append((number, tag, asyncio.ensure_future(refill.copy(keys))))
            while len(pending) >= in_flight:
                await _finish(pending, on_done, log)
        while pending:
            await _finish(pending, on_done, log)
    finally:
        await cancel_all(f for _, _, f in pending)


async def _finish(
    pending: deque[tuple[int, _Tag, asyncio.Future[BatchResult]]],
    on_done: Callable[[BatchResult, _Tag], Awaitable[None]],
    log: RebuildLog | None,
) -> None:
    number, tag, future = pending[0]
    result = await future
    pending.popleft()
    if log is not None:
        log.drop_pending(number)
    await on_done(result, tag)


async def in_batches(keys: Sequence[bytes], size: int) -> AsyncIterator[tuple[list[bytes], int]]:
    """`keys` as (batch, index of its end) pairs."""
    for start in range(0, len(keys), size):
        yield list(keys[start : start + size]), min(len(keys), start + size)


async def settle_pending(
    log: RebuildLog,
    peers: Sequence[Endpoint],
    target: Endpoint,
    *,
    settle_s: float,
    tolerance_ms: int,
    timeout_s: float,
) -> int:
    """After a crash: the keys of batches written but never verified. Where the peers
    agree a key is gone (two reads `settle_s` apart) and the target still holds one
    same state, it is deleted there under WATCH, as the batch's verification would have
    undone the copy. Other differences are left to the key-by-key repair. How many keys
    were looked at."""
    settled = 0
    for batch, keys in log.pending():
        first = await _observe_all([*peers, target], keys, timeout_s)
        await asyncio.sleep(settle_s)
        second = await _observe_all([*peers, target], keys, timeout_s)
        for key in keys:
            now = second[-1][key]
            stable = all(
                a[key].same_as(b[key], tolerance_ms) for a, b in zip(first, second, strict=True)
            )
            if stable and now.exists and not any(reads[key].exists for reads in second[:-1]):
                await _delete_if_same(target, key, now, tolerance_ms, timeout_s)
        settled += len(keys)
        log.drop_pending(batch)
    return settled


async def _observe_all(
    members: Sequence[Endpoint], keys: list[bytes], timeout_s: float
) -> list[dict[bytes, KeyState]]:
    async def one(member: Endpoint) -> dict[bytes, KeyState]:
        conn = await RespConnection.open(member, timeout_s=timeout_s)
        try:
            return await observe_keys(conn, keys, keep=False)
        finally:
            await conn.close()

    return await all_of(one(m) for m in members)


async def _delete_if_same(
    target: Endpoint, key: bytes, state: KeyState, tolerance_ms: int, timeout_s: float
) -> None:
    conn = await RespConnection.open(target, timeout_s=timeout_s)
    try:
        conn.check(await conn.request(pack(b"WATCH", key), 1))
        now = (await observe_keys(conn, [key], keep=False))[key]
        if not now.same_as(state, tolerance_ms):
            conn.check(await conn.request(pack(b"UNWATCH"), 1))
            return
        replies = await conn.request(pack(b"MULTI") + pack(b"DEL", key) + pack(b"EXEC"), 3)
        conn.check(replies[:1])
    finally:
        await conn.close()


@dataclass(frozen=True, kw_only=True)
class RefillOptions:
    """What a repair run's bulk refill reads of the settings (`of`)."""

    pages: PageOptions  # settle, TTL tolerance, command timeout, scratch prefix
    page_elements: int
    compare_ttls: bool  # settings.repair_ttls != "ignore"
    scripts: bool

    @classmethod
    def of(cls, s: Settings) -> RefillOptions:
        return cls(
            pages=PageOptions.of(s),
            page_elements=s.repair_page_elements,
            compare_ttls=s.repair_ttls != "ignore",
            scripts=s.allow_scripts,
        )


def pending_log(log_store: Store, run_id: str, group: str, target: str) -> RebuildLog:
    """The unverified-batch rows of one member's bulk refill within a `repair run`."""
    return RebuildLog(log_store, f"{run_id}/{group}/{target}")


async def refill_members(
    options: RefillOptions,
    group: ReplicaGroup,
    plan: dict[int, list[bytes]],
    *,
    rate: float | None,
    store: Store | None,
    run_id: str | None,
    progress: ProgressCallback | None,
) -> dict[int, set[bytes]]:
    """Copy each member's share of `plan` in bulk (members lacking fewer than `BULK_MIN`
    keys are left to the key-by-key path); per member refilled, the keys whose copies
    stood."""
    stood: dict[int, set[bytes]] = {}
    for t, keys in plan.items():
        # A Redis replica refuses writes and is refilled by its primary's sync: its keys
        # stay with the key-by-key path, which knows replication groups.
        if len(keys) >= BULK_MIN and not await replica_of(
            group.members[t], options.pages.timeout_s
        ):
            log = (
                pending_log(store, run_id, group.name, group.members[t].name)
                if store is not None and run_id is not None
                else None
            )
            stood[t] = await _refill_member(options, group, t, keys, rate, log, progress)
    return stood


async def _refill_member(
    options: RefillOptions,
    group: ReplicaGroup,
    t: int,
    keys: list[bytes],
    rate: float | None,
    log: RebuildLog | None,
    progress: ProgressCallback | None,
) -> set[bytes]:
    from replag.repair.keyspace.progress import RepairProgress

    target = group.members[t]
    peers = [m for i, m in enumerate(group.members) if i != t]
    pages = options.pages
    refill = Refill(
        peers,
        target,
        settle_s=pages.settle_s,
        tolerance_ms=pages.tolerance_ms,
        timeout_s=pages.timeout_s,
        page_elements=options.page_elements,
        compare_ttls=options.compare_ttls,
        scripts=options.scripts,
        scratch_prefix=pages.prefix,
    )
    stood: set[bytes] = set()
    started = time.monotonic()
    done = 0

    async def finished(result: BatchResult, end: int) -> None:
        nonlocal done
        stood.update(result.copied_keys)
        if result.big:
            _, not_copied = await copy_big_keys(pages, peers, target, result.big)
            left = set(not_copied)
            stood.update(k for k, _ in result.big if k not in left)
        done = end
        if progress is not None:
            elapsed = time.monotonic() - started
            rate_now = done / elapsed if elapsed > 0 else 0.0
            progress(RepairProgress(group.name, target.name, "bulk", done, len(keys), rate_now))

    try:
        await copy_batches(refill, in_batches(keys, BATCH), on_done=finished, rate=rate, log=log)
    finally:
        await refill.close()
    return stood


async def settle_members(pages: PageOptions, group: ReplicaGroup, store: Store, run_id: str) -> int:
    """A resumed `repair run`: every member's unverified bulk batches (`settle_pending`)."""
    settled = 0
    for t, target in enumerate(group.members):
        log = pending_log(store, run_id, group.name, target.name)
        if not log.pending():
            continue
        settled += await settle_pending(
            log,
            [m for i, m in enumerate(group.members) if i != t],
            target,
            settle_s=pages.settle_s,
            tolerance_ms=pages.tolerance_ms,
            timeout_s=pages.timeout_s,
        )
    return settled
