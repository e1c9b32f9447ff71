"""`rebuild`: refill a replaced or wiped replica of a peer group from its peers, at line rate.

The source peer's keyspace is walked with SCAN; each batch goes through
`refill.Refill` (read on every peer with its write counters, copied where they agree and the
target lacks the key, verified `repair_settle` later), several batches at once.
The run is checkpointed (`rebuild_log`), throttled (`scan_rate`, `repair_rate`)
and reports progress with an ETA. Collections above `repair_page_elements` are
copied in pages (`pages`). What the bulk copy leaves (keys the peers disagree on,
keys written during the copy, keys only other members hold: `bulk.closing`) is
closed at the end by a `repair run` of the group limited to those keys, the closing
pass (`full_closing_pass`: a whole `repair run` instead, as after a resume, which
no longer knows them, or when they are more than a third of the source's keys).

A replica of a Redis replication group is not rebuilt here: Redis's own full sync
is the way (`ReplicaOfPrimary` says how to trigger it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from replag.config import Config
from replag.errors import NotFound, RepairError, UsageError
from replag.repair.bulk.closing import SourceKeys, keys_elsewhere, quiet, writes_seen
from replag.repair.bulk.copy import RefillOptions, copy_batches, settle_pending
from replag.repair.bulk.peer_read import Writes
from replag.repair.bulk.rebuild_log import RebuildLog
from replag.repair.bulk.refill import BATCH, BatchResult, Refill
from replag.repair.decisions.replica_role import replica_of, resync_advice
from replag.repair.decisions.report import KEYS_NAMED, LEFT
from replag.repair.engine import repair
from replag.repair.keyspace.observe import key_from_json, key_text
from replag.repair.keyspace.pages import copy_big_keys
from replag.repair.keyspace.progress import ProgressCallback, RepairProgress
from replag.repair.keyspace.together import all_of, cancel_all
from replag.repair.reachable import members_reachable
from replag.repair.runs import DONE, FAILED, INTERRUPTED, RUNNING, RunLog
from replag.repair.scan.scanner import without_prefix
from replag.settings import Settings
from replag.store import Store
from replag.topology import Endpoint, ReplicaGroup
from replag.wire.resp import RespConnection, pack

_Item = TypeVar("_Item")


def _size(count: float) -> str:
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
            f": about {self.keys:,} keys / {_size(self.bytes_estimate)} to copy\n"
            f"  rate {rate}; time {eta}"
        )


@dataclass(kw_only=True)
class RebuildReport:
    run_id: str
    plan: RebuildPlan
    status: str
    counts: BatchResult
    seconds: float
    big_copied: int = 0
    settled_on_resume: int = 0  # keys of unverified batches settled by a resume
    closing: dict[str, Any] | None = None
    closing_s: float = 0.0
    closing_keys: int | None = None  # keys the closing pass looked at; None: all (full)
    left: list[bytes] = field(default_factory=list)

    @property
    def keys_per_s(self) -> float:
        return self.counts.keys / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        c = self.counts
        return {
            "run_id": self.run_id,
            "kind": "rebuild",
            "status": self.status,
            "plan": self.plan.to_dict(),
            "keys_read": c.keys,
            "copied": c.copied,
            "big_copied": self.big_copied,
            "bytes_copied": c.bytes_copied,
            "present": len(c.present),
            "disagree": len(c.disagree),
            "gone": c.gone,
            "changed": len(c.changed),
            "undo_failed": len(c.undo_failed),
            "expired": c.expired,
            "settled_on_resume": self.settled_on_resume,
            "seconds": round(self.seconds, 3),
            "keys_per_s": round(self.keys_per_s),
            "closing": self.closing,
            "closing_s": round(self.closing_s, 3),
            "closing_keys": self.closing_keys,
        }

    def render(self) -> str:
        d = self.to_dict()
        lines = [
            f"rebuild {self.run_id}: {self.status}",
            f"  read {d['keys_read']:,} keys of {self.plan.source} in {self.seconds:.1f} s "
            f"({d['keys_per_s']:,} keys/s); copied {d['copied'] + d['big_copied']:,} "
            f"({_size(d['bytes_copied'])}, {d['big_copied']} in pages) to {self.plan.target}",
            f"  left to the closing pass: {d['present']:,} already on the target, "
            f"{d['disagree']:,} the peers disagree on, {d['changed']:,} written during the "
            f"copy; {d['gone']:,} gone everywhere, {d['expired']:,} expired",
        ]
        if d["undo_failed"]:
            lines.append(f"  {d['undo_failed']} copies a client changed in place: check them")
        if self.settled_on_resume:
            lines.append(f"  resumed: {self.settled_on_resume} unverified copies settled first")
        if self.closing is not None:
            c = self.closing
            scope = (
                "every key"
                if self.closing_keys is None
                else f"{self.closing_keys:,} keys the copy left"
            )
            lines.append(
                f"  closing pass {c['run_id']} ({scope}): divergent {c['divergent']}, repaired "
                f"{c['repaired']}, conflicts {c['conflicts']}, busy {c['busy']} "
                f"({self.closing_s:.1f} s)"
            )
            for k in c.get("not_fixed", []):
                reason = f": {k['reason']}" if k["reason"] else ""
                lines.append(f"    not fixed: {k['key']!r} {k['status']}{reason}")
        return "\n".join(lines)


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


def _member(group: ReplicaGroup, name: str, option: str) -> Endpoint:
    for member in group.members:
        if member.name == name:
            return member
    names = ", ".join(m.name for m in group.members)
    raise NotFound(f"{option} {name}: not a member of group {group.name} (members: {names})")


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
        settings: Settings,
        group: ReplicaGroup,
        target: Endpoint,
        source: Endpoint | None,
        *,
        rate: float | None,
        progress: ProgressCallback | None,
    ) -> None:
        s = settings
        self.group, self.target = group, target
        self.peers = [m for m in group.members if m.name != target.name]
        self.source = source
        # What the copy reads of the settings (the same as a repair run's bulk refill).
        self.options = RefillOptions.of(s)
        self.timeout_s = self.options.pages.timeout_s
        self.tolerance_ms = self.options.pages.tolerance_ms
        self.prefix = self.options.pages.prefix
        limits = [r for r in (s.scan_rate, s.repair_rate) if r]
        self.rate = (rate or None) if rate is not None else (min(limits) if limits else None)
        self.progress = progress
        self.counts = BatchResult()
        self.big_copied = 0
        self.source_keys = SourceKeys()  # what the source's scan returned
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


async def rebuild(
    config: Config,
    *,
    group: str,
    replica: str,
    source: str | None = None,
    rate: float | None = None,
    store: Store | None = None,
    resume: str | None = None,
    dry_run: bool = False,
    closing_pass: bool = True,
    full_closing_pass: bool = False,
    progress: ProgressCallback | None = None,
    on_plan: Callable[[RebuildPlan], None] | None = None,
    on_run: Callable[[str], None] | None = None,
) -> RebuildReport:
    """Plan the rebuild of `replica` (`on_plan` gets the plan), then (unless `dry_run`)
    do it, resumable from `store`, and close with a `repair run` of the keys the copy
    left (of every key with `full_closing_pass`, or after a resume)."""
    log: RebuildLog | None = None
    run: RunLog | None = None
    if resume is not None:
        run, params = _resumed(store, resume)
        group, replica = params["group"], params["replica"]
        source, rate = params.get("source"), params.get("rate")
        closing_pass = params.get("closing_pass", True)
        full_closing_pass = params.get("full_closing_pass", False)
    replica_group = config.topology.group(group)
    if replica_group.kind == "replication":
        raise UsageError(
            f"group {group} is a replication group: its replicas are rebuilt by Redis's own "
            f"full sync from the primary, not by replag (`replag repair rebuild` on a replica "
            f"says how to trigger one); see the runbook 'Rebuilding a replica'"
        )
    if len(replica_group.members) < 2:
        raise UsageError(f"replica group {group!r} has no peers to rebuild {replica} from")
    target = _member(replica_group, replica, "--replica")
    src = _member(replica_group, source, "--source") if source is not None else None
    if src is not None and src.name == target.name:
        raise UsageError(f"--source {source}: the replica being rebuilt cannot be its source")
    await members_reachable([replica_group], timeout_s=config.settings.connect_timeout)
    job = Rebuild(config.settings, replica_group, target, src, rate=rate, progress=progress)
    # The read-only sample only where its ETA is the answer: it costs a second of reads.
    plan = await job.plan(sample_s=1.0 if dry_run else None)
    if on_plan is not None:
        on_plan(plan)
    if dry_run:
        return RebuildReport(
            run_id="", plan=plan, status="dry_run", counts=BatchResult(), seconds=0.0
        )
    params = {
        "group": group,
        "replica": replica,
        "source": plan.source,
        "rate": rate,
        "closing_pass": closing_pass,
        "full_closing_pass": full_closing_pass,
    }
    if run is None and store is not None:
        run = RunLog.create(store, kind="rebuild", params=params)
    if run is not None:
        run.set_status(RUNNING)
        log = RebuildLog(run.store, run.run_id)
        if on_run is not None:
            on_run(run.run_id)
    report = RebuildReport(
        run_id=run.run_id if run is not None else "",
        plan=plan,
        status=RUNNING,
        counts=job.counts,
        seconds=0.0,
    )
    try:
        if log is not None:
            report.settled_on_resume = await job.settle_pending(log)
        report.seconds = await job.run(log, plan)
        report.big_copied = job.big_copied
        if closing_pass:
            started = time.monotonic()
            keys = None if full_closing_pass else await job.closing_keys()
            if keys is not None and len(keys) > plan.source_keys // WHOLE_PASS_SHARE:
                # A target that already held much of it: a whole pass (trees, then the
                # differing leaves) beats reading each key on every member twice.
                keys = None
            report.closing_keys = None if keys is None else len(keys)
            closing = await repair(config, group=group, store=store, progress=progress, keys=keys)
            report.closing_s = time.monotonic() - started
            summary = closing.to_dict()
            report.closing = {
                k: v for k, v in summary.items() if k not in ("divergent_keys", "groups")
            }
            # The keys it could not fix, by name (a vector set the target cannot load, …).
            report.closing["not_fixed"] = [
                {**key_text(key_from_json(k)), "status": k["status"], "reason": k.get("reason", "")}
                for k in summary["divergent_keys"]
                if k.get("status") in LEFT
            ][:KEYS_NAMED]
    except RepairError as exc:
        if run is not None:
            run.set_status(FAILED, error=str(exc))
        raise
    except (KeyboardInterrupt, asyncio.CancelledError):
        if run is not None:
            run.set_status(INTERRUPTED, error="interrupted")
        raise
    except Exception as exc:
        if run is not None:
            run.set_status(FAILED, error=f"{type(exc).__name__}: {exc}")
        raise
    report.status = DONE
    if run is not None:
        run.set_status(DONE, report=report.to_dict())
    return report


def _resumed(store: Store | None, run_id: str) -> tuple[RunLog, dict[str, Any]]:
    if store is None:
        raise UsageError("--resume needs the results store (settings.store)")
    run = RunLog(store, run_id)
    row = run.row()
    if row is None:
        raise UsageError(f"--resume: no run {run_id!r} in {store.shown}")
    kind, status, params = row
    if kind != "rebuild":
        raise UsageError(f"--resume: {run_id} is a {kind} run, not a rebuild")
    if status == DONE:
        raise UsageError(f"--resume: run {run_id} has already finished")
    return run, params


__all__ = ["RebuildPlan", "RebuildReport", "rebuild"]
