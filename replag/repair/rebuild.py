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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from replag.config import Config
from replag.errors import NotFound, RepairError, UsageError
from replag.repair.bulk.rebuild_copy import (
    WHOLE_PASS_SHARE,
    Rebuild,
    RebuildOptions,
    RebuildPlan,
    size_text,
)
from replag.repair.bulk.rebuild_log import RebuildLog
from replag.repair.bulk.refill import BatchResult
from replag.repair.decisions.report import KEYS_NAMED, LEFT
from replag.repair.engine import repair
from replag.repair.keyspace.observe import key_from_json, key_text
from replag.repair.keyspace.progress import ProgressCallback
from replag.repair.reachable import members_reachable
from replag.repair.runs import DONE, FAILED, INTERRUPTED, RUNNING, RunLog
from replag.store import Store
from replag.topology import Endpoint, ReplicaGroup


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
            f"({size_text(d['bytes_copied'])}, {d['big_copied']} in pages) to {self.plan.target}",
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


def _member(group: ReplicaGroup, name: str, option: str) -> Endpoint:
    for member in group.members:
        if member.name == name:
            return member
    names = ", ".join(m.name for m in group.members)
    raise NotFound(f"{option} {name}: not a member of group {group.name} (members: {names})")


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
    job = Rebuild(
        RebuildOptions.of(config.settings), replica_group, target, src, rate=rate, progress=progress
    )
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
    finally:
        job.source_keys.close()
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
