"""The rebuild's copy of one member from its peers: its plan (sizes, rate, ETA) and the job
(the source's SCAN read ahead, batches through `refill.Refill` several at a time,
checkpointed in a `RebuildLog`, then what is left for the closing pass: `closing`).

`repair rebuild` runs it and then its closing pass (`replag.repair.rebuild`); `repair run`
runs it first for a member found wiped or nearly empty (`replag.repair.wiped_member`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

from replag.errors import UsageError
from replag.repair.bulk.closing import keys_elsewhere, quiet, writes_seen
from replag.repair.bulk.copy import RefillOptions, copy_batches, settle_pending
from replag.repair.bulk.peer_read import Writes
from replag.repair.bulk.rebuild_log import RebuildLog
from replag.repair.bulk.refill import BATCH, BatchResult, Refill
from replag.repair.bulk.source_keys import SourceKeys
from replag.repair.decisions.replica_role import replica_of, resync_advice
from replag.repair.keyspace.pages import copy_big_keys
from replag.repair.keyspace.progress import ProgressCallback, RepairProgress
from replag.repair.keyspace.together import all_of, cancel_all
from replag.repair.scan.scanner import without_prefix
from replag.settings import Settings
from replag.topology import Endpoint, ReplicaGroup
from replag.wire.resp import RespConnection, pack

_Item = TypeVar("_Item")


def size_text(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1000
    return f"{count:,.1f} GB"


@dataclass(kw_only=True)
class RebuildPlan:
    """What a rebuild will do: from which peers, how many keys and bytes, how long."""

    group: str
    target: str
    source: str
    peers: list[str]
    source_keys: int
    target_keys: int
    bytes_estimate: int
    rate: float | None  # keys/s: the throttle, or a read sample's
    rate_note: str

    @property
    def keys(self) -> int:
        return max(0, self.source_keys - self.target_keys)

    @property
    def eta_s(self) -> float | None:
        return self.keys / self.rate if self.rate else None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "keys": self.keys, "eta_s": self.eta_s}

    def render(self) -> str:
        eta = f"~{self.eta_s:,.0f} s" if self.eta_s is not None else "unknown"
        rate = f"{self.rate:,.0f} keys/s ({self.rate_note})" if self.rate else self.rate_note
        return (
            f"rebuild {self.target} (group {self.group}) from {', '.join(self.peers)}; "
            f"SCAN of {self.source}\n"
            f"  {self.source} holds {self.source_keys:,} keys, {self.target} {self.target_keys:,}"
            f": about {self.keys:,} keys / {size_text(self.bytes_estimate)} to copy\n"
            f"  rate {rate}; time {eta}"
        )


SOURCE_SHARE = 4  # of check_memory_mb, for the source's key hashes (`SourceKeys`)


@dataclass(frozen=True, kw_only=True)
class RebuildOptions:
    """What a rebuild's copy reads of the settings (`of`): the same as a repair run's bulk
    refill, its throttle, and the memory its source's key hashes may hold."""

    refill: RefillOptions
    rate: float | None  # keys/s: the lower of scan_rate and repair_rate, if either is set
    source_memory_bytes: int  # a quarter of check_memory_mb, the rest spilled

    @classmethod
    def of(cls, s: Settings) -> RebuildOptions:
        limits = [r for r in (s.scan_rate, s.repair_rate) if r]
        return cls(
            refill=RefillOptions.of(s),
            rate=min(limits) if limits else None,
            source_memory_bytes=(s.check_memory_mb << 20) // SOURCE_SHARE,
        )


SCAN_AHEAD = 8  # SCAN batches read ahead of the copy
# The closing pass is a whole `repair run` when the copy left more than this share
# (1/N) of the source's keys to it.
WHOLE_PASS_SHARE = 3


async def ahead(source: AsyncIterator[_Item], depth: int) -> AsyncIterator[_Item]:
    """`source`'s items, read by a task of its own up to `depth` ahead of the consumer."""
    queue: asyncio.Queue[tuple[_Item | None, BaseException | None, bool]] = asyncio.Queue(depth)

    async def fill() -> None:
        try:
            async for item in source:
                await queue.put((item, None, False))
            await queue.put((None, None, True))
        except Exception as exc:  # handed to the consumer, raised there
            await queue.put((None, exc, True))

    task = asyncio.ensure_future(fill())
    try:
        while True:
            item, error, end = await queue.get()
            if error is not None:
                raise error
            if end:
                return
            assert item is not None
            yield item
    finally:
        await cancel_all([task])


async def _dbsize(endpoint: Endpoint, timeout_s: float) -> tuple[int, int]:
    """(keys, dataset bytes) of `endpoint`'s database."""
    conn = await RespConnection.open(endpoint, timeout_s=timeout_s)
    try:
        size, memory = await conn.request(pack(b"DBSIZE") + pack(b"INFO", b"memory"), 2)
        conn.check([size, memory])
    finally:
        await conn.close()
    used = 0
    for line in bytes(memory).splitlines():
        name, _, value = line.partition(b":")
        if name in (b"used_memory_dataset", b"used_memory") and value.strip().isdigit():
            used = int(value)
            if name == b"used_memory_dataset":
                break
    return int(size), used


class Rebuild:
    """One rebuild of `target` in `group` (see the module docstring)."""

    def __init__(
        self,
        options: RebuildOptions,
        group: ReplicaGroup,
        target: Endpoint,
        source: Endpoint | None,
        *,
        rate: float | None,
        progress: ProgressCallback | None,
    ) -> None:
        self.group, self.target = group, target
        self.peers = [m for m in group.members if m.name != target.name]
        self.source = source
        self.options = options.refill
        self.timeout_s = self.options.pages.timeout_s
        self.tolerance_ms = self.options.pages.tolerance_ms
        self.prefix = self.options.pages.prefix
        self.rate = (rate or None) if rate is not None else options.rate
        self.progress = progress
        self.counts = BatchResult()
        self.big_copied = 0
        # What the source's scan returned: a quarter of check_memory_mb, the rest spilled.
        self.source_keys = SourceKeys(memory_bytes=options.source_memory_bytes)
        self.resumed = False  # then what the copy handed back before is not known
        # Per peer: how many of the source's keys it held when read; its write counters
        # and size before the copy (`bulk.closing.quiet`).
        self.held = [0 for _ in self.peers]
        self.before: list[tuple[Writes, int]] = []

    def _refill(self) -> Refill:
        o = self.options
        return Refill(
            self.peers,
            self.target,
            settle_s=o.pages.settle_s,
            tolerance_ms=self.tolerance_ms,
            timeout_s=self.timeout_s,
            page_elements=o.page_elements,
            compare_ttls=o.compare_ttls,
            scripts=o.scripts,
            scratch_prefix=self.prefix,
        )

    async def plan(self, *, sample_s: float | None = 1.0) -> RebuildPlan:
        """Sizes of source and target, and the rate: the throttle, else a read-only sample
        of the copy's reads (every peer) for `sample_s` (None: no sample,
        the rate is measured as the copy goes)."""
        advice = await replica_of(self.target, self.timeout_s)
        if advice is not None:
            raise UsageError(resync_advice(self.target, advice))
        sizes = await all_of(_dbsize(m, self.timeout_s) for m in (*self.peers, self.target))
        if self.source is None:
            self.source = self.peers[max(range(len(self.peers)), key=lambda i: sizes[i][0])]
        keys, used = sizes[self.peers.index(self.source)]
        target_keys = sizes[-1][0]
        missing = max(0, keys - target_keys)
        bytes_estimate = int(used * missing / keys) if keys else 0
        rate: float | None = self.rate
        if rate:
            note = "the throttle: scan_rate / repair_rate / --rate"
        elif sample_s is None:
            note = "as fast as the servers answer (the progress line shows the rate)"
        else:
            rate, note = await self._sample(sample_s), f"read-only sample of {sample_s:g} s"
        return RebuildPlan(
            group=self.group.name,
            target=self.target.name,
            source=self.source.name,
            peers=[p.name for p in self.peers],
            source_keys=keys,
            target_keys=target_keys,
            bytes_estimate=bytes_estimate,
            rate=rate,
            rate_note=note,
        )

    async def _sample(self, seconds: float) -> float | None:
        """Keys/s the copy's reads reach for `seconds` (nothing is written)."""
        assert self.source is not None
        refill = self._refill()
        scan = await RespConnection.open(self.source, timeout_s=self.timeout_s)
        read = 0
        started = time.monotonic()
        try:
            cursor = b"0"
            while time.monotonic() - started < seconds:
                (cursor, keys), *_ = await scan.request(pack(b"SCAN", cursor, b"COUNT", BATCH), 1)
                keys = without_prefix(keys, self.prefix)
                read += len(await refill.read_only(keys)) if keys else 0
                if cursor == b"0":
                    break
        finally:
            await scan.close()
            await refill.close()
        elapsed = time.monotonic() - started
        # Batches run IN_FLIGHT at a time in the copy; the sample read them one by one.
        return read / elapsed if read and elapsed > 0 else None

    async def run(self, log: RebuildLog | None, plan: RebuildPlan) -> float:
        """Copy everything; seconds taken."""
        assert self.source is not None
        cursor = b"0"
        if log is not None:
            saved = log.load()
            if saved is not None:
                cursor, stats = saved
                self._restore(stats)
                self.resumed = True
        refill = self._refill()
        self.before = await all_of(writes_seen(p, self.timeout_s) for p in self.peers)
        scan = await RespConnection.open(self.source, timeout_s=self.timeout_s)
        started = time.monotonic()
        done_before = self.counts.keys
        last_save = time.monotonic()

        async def scanned() -> AsyncIterator[tuple[list[bytes], bytes]]:
            at = cursor
            while True:
                (at, keys), *_ = await scan.request(pack(b"SCAN", at, b"COUNT", BATCH), 1)
                keys = without_prefix(keys, self.prefix)
                self.source_keys.add(keys)
                yield keys, at
                if at == b"0":
                    return

        def batches() -> AsyncIterator[tuple[list[bytes], bytes]]:
            # The SCAN runs ahead of the copy: its round trip is off the copy's path.
            return ahead(scanned(), SCAN_AHEAD)

        async def done(result: BatchResult, after: bytes) -> None:
            nonlocal last_save
            await self._finish(result)
            if log is not None and (time.monotonic() - last_save >= 1.0 or after == b"0"):
                log.save(after, self._stats())  # every batch before `after` is verified
                last_save = time.monotonic()
            self._report(plan, started, done_before)

        try:
            await copy_batches(refill, batches(), on_done=done, rate=self.rate, log=log)
        finally:
            await scan.close()
            await refill.close()
        return time.monotonic() - started

    async def _finish(self, result: BatchResult) -> None:
        for p, count in enumerate(result.held):
            self.held[p] += count
        if result.big:
            copied, left = await copy_big_keys(
                self.options.pages, self.peers, self.target, result.big
            )
            self.big_copied += copied
            result.changed += left
            result.big = []
        self.counts.add(result)

    def _report(self, plan: RebuildPlan, started: float, done_before: int) -> None:
        if self.progress is None:
            return
        elapsed = time.monotonic() - started
        rate = (self.counts.keys - done_before) / elapsed if elapsed > 0 else 0.0
        self.progress(
            RepairProgress(
                self.group.name,
                self.target.name,
                "rebuild",
                self.counts.keys,
                plan.source_keys or None,
                rate,
            )
        )

    def _stats(self) -> dict[str, Any]:
        c = self.counts
        return {
            "keys": c.keys,
            "copied": c.copied,
            "bytes_copied": c.bytes_copied,
            "gone": c.gone,
            "expired": c.expired,
            "big_copied": self.big_copied,
            # Keys left to the closing pass are not kept: after a resume it is a whole
            # repair run, which finds them itself.
            "present": len(c.present),
            "disagree": len(c.disagree),
            "changed": len(c.changed),
            "undo_failed": len(c.undo_failed),
        }

    def _restore(self, stats: dict[str, Any]) -> None:
        c = self.counts
        c.keys, c.copied, c.bytes_copied = stats["keys"], stats["copied"], stats["bytes_copied"]
        c.gone, c.expired = stats["gone"], stats["expired"]
        self.big_copied = stats["big_copied"]
        # Counted, not listed: the closing pass (a whole repair run now) finds them again.
        c.present = [b""] * stats["present"]
        c.disagree = [b""] * stats["disagree"]
        c.changed = [b""] * stats["changed"]
        c.undo_failed = [b""] * stats["undo_failed"]

    def handed_back(self) -> list[bytes]:
        """The keys the copy left for the closing pass (see `bulk.closing`)."""
        c = self.counts
        return [*c.present, *c.disagree, *c.changed, *c.undo_failed]

    async def closing_keys(self) -> list[bytes] | None:
        """What the closing pass looks at: the keys handed back and those other members
        hold that the source lacks; None (every key) after a resume."""
        if self.resumed:
            return None
        assert self.source is not None
        after = await all_of(writes_seen(p, self.timeout_s) for p in self.peers)
        # A key the scan returned twice was counted twice: then nothing is proven.
        repeats = self.source_keys.repeats()
        walked = [
            peer
            for peer, before, now, held in zip(
                self.peers, self.before, after, self.held, strict=True
            )
            if peer.name != self.source.name and (repeats or not quiet(before, now, held))
        ]
        elsewhere = await keys_elsewhere(
            walked, self.source_keys, prefix=self.prefix, timeout_s=self.timeout_s
        )
        return sorted({*self.handed_back(), *elsewhere})

    async def settle_pending(self, log: RebuildLog) -> int:
        """After a crash: the batches written but not verified (`bulk.settle_pending`)."""
        return await settle_pending(
            log,
            self.peers,
            self.target,
            settle_s=self.options.pages.settle_s,
            tolerance_ms=self.tolerance_ms,
            timeout_s=self.timeout_s,
        )


__all__ = ["WHOLE_PASS_SHARE", "Rebuild", "RebuildPlan", "size_text"]
