"""`check` and `repair`: the lifecycle of one run over one or every replica group.

A run is created in the store (or resumed from it), walks its groups in order
(`group_run.GroupRun` does one group's scan, diff, verify and repair), and ends
done, failed (resumable when an endpoint failed) or interrupted.
"""

from __future__ import annotations

import asyncio
import time

from replag.config import Config
from replag.errors import EndpointError, RepairError, ReplagError, UsageError
from replag.repair import report as rp
from replag.repair.group_run import GroupRun, ProgressCallback, RepairProgress, RunParams
from replag.repair.observe import key_from_json
from replag.repair.policy import parse_policy
from replag.repair.remote import AgentPool
from replag.repair.runs import DONE, FAILED, INTERRUPTED, RUNNING, RunLog, new_run_id
from replag.store import Store


async def _run(
    config: Config,
    params: RunParams,
    *,
    store: Store | None,
    resume: str | None,
    progress: ProgressCallback | None,
) -> rp.RepairReport:
    log: RunLog | None = None
    if resume is not None:
        if store is None:
            raise UsageError("--resume needs the results store (settings.store)")
        log = RunLog(store, resume)
        row = log.row()
        if row is None:
            raise UsageError(f"--resume: no run {resume!r} in {store.path}")
        _, status, saved = row
        if status == DONE:
            raise UsageError(f"--resume: run {resume} has already finished")
        params = RunParams(**saved)
        log.set_status(RUNNING)
    elif store is not None:
        log = RunLog.create(store, kind=params.kind, params=params.to_dict())
    run_id = log.run_id if log is not None else new_run_id(params.kind)
    topology = config.topology
    groups = [topology.group(params.group)] if params.group else list(topology.groups)
    if not groups:
        raise UsageError("the topology has no replica groups to compare ([[groups]])")
    policies = [parse_policy(params.policy, g.members) for g in groups]
    for g in groups:
        if len(g.members) < 2:
            raise UsageError(f"replica group {g.name!r} has {len(g.members)} member(s); need 2+")
    started = time.perf_counter()
    reports: list[rp.GroupReport] = []

    def result(status: str) -> rp.RepairReport:
        return rp.RepairReport(
            run_id=run_id,
            kind=params.kind,
            group=params.group,
            policy=params.policy if params.kind == "repair" else None,
            dry_run=params.dry_run,
            allow_deletes=params.allow_deletes,
            status=status,
            groups=reports,
            seconds=time.perf_counter() - started,
        )

    agents = AgentPool(config)
    try:
        for g, policy in zip(groups, policies, strict=True):
            run = GroupRun(config, g, params, policy, log, progress, agents)
            reports.append(await run.run())
    except EndpointError as exc:
        message = f"{exc.message}; run {run_id} can be resumed with --resume {run_id}"
        if log is not None:
            log.set_status(FAILED, error=str(exc))
        raise RepairError(message, where=exc.where) from exc
    except ReplagError as exc:
        if log is not None:
            log.set_status(FAILED, error=str(exc))
        raise
    except (KeyboardInterrupt, asyncio.CancelledError):
        if log is not None:
            log.set_status(INTERRUPTED, error="interrupted")
        raise
    except Exception as exc:
        # A bug, not an endpoint: the run must not stay "running" forever in the store.
        if log is not None:
            log.set_status(FAILED, error=f"internal error: {exc!r}")
        raise
    finally:
        await agents.close()
    report = result(DONE)
    if log is not None:
        log.set_status(DONE, report=report.to_dict())
    return report


async def check(
    config: Config,
    *,
    group: str | None = None,
    store: Store | None = None,
    progress: ProgressCallback | None = None,
    match: str | None = None,
    type_filter: str | None = None,
    resume: str | None = None,
) -> rp.RepairReport:
    """Find the keys on which the members of `group` (None = every group) differ."""
    params = RunParams(
        kind="check",
        group=group,
        policy="quorum",
        dry_run=True,
        allow_deletes=False,
        rate=None,
        max_inflight=config.settings.max_inflight,
        match=match,
        type_filter=type_filter,
    )
    return await _run(config, params, store=store, resume=resume, progress=progress)


async def repair(
    config: Config,
    *,
    group: str | None = None,
    policy: str = "quorum",
    dry_run: bool = False,
    allow_deletes: bool = False,
    rate: float | None = None,
    max_inflight: int | None = None,
    resume: str | None = None,
    store: Store | None = None,
    progress: ProgressCallback | None = None,
    match: str | None = None,
    type_filter: str | None = None,
) -> rp.RepairReport:
    """Find and repair divergence; see the module docstring of `policy` for the rules."""
    if rate is not None and rate < 0:
        raise UsageError("--rate: must be >= 0")
    if max_inflight is not None and max_inflight < 1:
        raise UsageError("--max-inflight: must be >= 1")
    params = RunParams(
        kind="repair",
        group=group,
        policy=policy,
        dry_run=dry_run,
        allow_deletes=allow_deletes,
        rate=(rate if rate is not None else config.settings.repair_rate) or None,
        max_inflight=config.settings.max_inflight if max_inflight is None else max_inflight,
        match=match,
        type_filter=type_filter,
    )
    return await _run(config, params, store=store, resume=resume, progress=progress)


__all__ = ["ProgressCallback", "RepairProgress", "check", "key_from_json", "repair"]
