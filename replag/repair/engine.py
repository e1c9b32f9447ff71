"""`check` and `repair`: the lifecycle of one run over one or every replica group.

A run is created in the store (or resumed from it), checks that every member
answers, walks its groups in order (`group_run.GroupRun` does one group's
scan, diff, verify and repair), and ends done, failed (resumable when an
endpoint failed; the message names the command) or interrupted. `check` and
`repair` are the only places here handed the config: the run takes what it reads
of it once (`run_state.RunSetup`) and its groups read the run's `RunState`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from replag.config import Config
from replag.durations import format_span
from replag.errors import (
    EndpointError,
    JobConflict,
    RepairError,
    ReplagError,
    StoreError,
    UsageError,
)
from replag.logfields import bind_log_fields
from replag.plural import count
from replag.repair.decisions import report as rp
from replag.repair.decisions.outages import cut_off_replicas
from replag.repair.decisions.policy import Policy, parse_policy
from replag.repair.decisions.roles import GroupShape, group_shape
from replag.repair.exclusive import release_groups, renew_groups, take_groups
from replag.repair.group_run import GroupRun
from replag.repair.keyspace.databases import unchecked_databases
from replag.repair.keyspace.observe import key_from_json
from replag.repair.keyspace.progress import ProgressCallback, RepairProgress
from replag.repair.keyspace.together import cancel_all
from replag.repair.reachable import members_reachable
from replag.repair.run_state import KeySink, RunParams, RunSetup, RunState
from replag.repair.runs import (
    DONE,
    FAILED,
    HEARTBEAT_S,
    INTERRUPTED,
    RUNNING,
    RunLog,
    new_run_id,
    resume_command,
)
from replag.repair.trees.remote import AgentPool
from replag.settings import REPAIR_TTLS
from replag.store import Store
from replag.store.leases import Lease
from replag.topology import ReplicaGroup, Topology
from replag.wire.permissions import Mode

logger = logging.getLogger(__name__)


async def _run(
    setup: RunSetup,
    params: RunParams,
    *,
    store: Store | None,
    resume: str | None,
    progress: ProgressCallback | None,
    on_run: Callable[[str], None] | None = None,
    key_sink: KeySink | None = None,
    acl_mode: Mode | None = None,
    keys: Sequence[bytes] | None = None,
) -> rp.RepairReport:
    """Run `params` (or resume run `resume`): every member must answer first; no other
    check or repair of its groups may run meanwhile (`replag.repair.exclusive`).
    `acl_mode`: the ACL recipe of the process running it (serve), for a refusal's advice.
    `keys`: only these keys are verified (and repaired), nothing is scanned."""
    groups = _groups(setup.topology, params.group)
    if resume is not None:
        _, saved = _resumed(setup.config_name, params.kind, store, resume)
        groups = _groups(setup.topology, saved.group, check=False)
    if store is None:
        return await _run_exclusive(
            setup, params, store, resume, progress, on_run, key_sink, acl_mode, keys
        )
    ttl_s = setup.settings.lease_time
    held = await _take_groups(store, [g.name for g in groups], ttl_s)
    this = asyncio.current_task()
    unconfirmed: list[str] = []
    keeper = asyncio.create_task(_keep_groups(store, held, ttl_s, this, unconfirmed))
    try:
        return await _run_exclusive(
            setup, params, store, resume, progress, on_run, key_sink, acl_mode, keys
        )
    except asyncio.CancelledError:
        if not unconfirmed or this is None:
            raise
        this.uncancel()  # stopped by its own lease keeper: a failure to report, not a cancel
        raise RepairError(unconfirmed[0], where=store.shown) from None
    finally:
        await cancel_all([keeper])
        await asyncio.to_thread(release_groups, store, held)


async def _take_groups(store: Store, names: list[str], ttl_s: float) -> list[Lease]:
    """`take_groups` in a thread. Cancelled meanwhile (Ctrl-C), the thread still takes the
    leases: they are released before the cancellation goes on, or a run resumed by this
    process would be refused for `lease_time`."""
    taking = asyncio.ensure_future(asyncio.to_thread(take_groups, store, names, ttl_s=ttl_s))
    try:
        return await asyncio.shield(taking)
    except asyncio.CancelledError:
        with contextlib.suppress(ReplagError):
            await asyncio.to_thread(release_groups, store, await taking)
        raise


# A group lease is surely held until this fraction of lease_time after its last renewal.
_SAFE_FRACTION = 0.75


async def _keep_groups(
    store: Store,
    held: list[Lease],
    ttl_s: float,
    run: asyncio.Task[Any] | None,
    unconfirmed: list[str] | None = None,
) -> None:
    """Renew the run's group leases; a lost one (this process was paused past it and
    another run took the group) stops the run before its next write."""
    confirmed = time.monotonic()
    while True:
        await asyncio.sleep(ttl_s / 4)
        asked = time.monotonic()
        try:
            held[:] = await asyncio.to_thread(renew_groups, store, held, ttl_s=ttl_s)
            confirmed = asked
        except StoreError as exc:
            logger.warning("group leases not renewed: %s", exc)
            # Repair writes need the lease (unlike probes): once it may have expired
            # unseen, another instance may take the group, so this run stops (resumable).
            if time.monotonic() - confirmed >= ttl_s * _SAFE_FRACTION:
                why = (
                    f"group leases unconfirmed for {time.monotonic() - confirmed:.0f} s (the "
                    "store cannot be reached): stopping this run before its next write; "
                    "resume it when the store is back"
                )
                logger.error("%s", why)
                if unconfirmed is not None:
                    unconfirmed.append(why)
                if run is not None:
                    run.cancel()
                return
        except JobConflict as exc:
            logger.error("%s; stopping this run", exc)
            if run is not None:
                run.cancel()
            return


async def _run_exclusive(
    setup: RunSetup,
    params: RunParams,
    store: Store | None,
    resume: str | None,
    progress: ProgressCallback | None,
    on_run: Callable[[str], None] | None,
    key_sink: KeySink | None,
    acl_mode: Mode | None = None,
    keys: Sequence[bytes] | None = None,
) -> rp.RepairReport:
    groups = _groups(setup.topology, params.group)
    log: RunLog | None = None
    if resume is not None:
        log, params = _resumed(setup.config_name, params.kind, store, resume)
        groups = _groups(setup.topology, params.group, check=False)
    for g in groups:  # a policy the groups cannot use is refused before the run is recorded
        parse_policy(params.policy, g.members, kind=g.kind)
    if log is not None:
        log.set_status(RUNNING)
    elif store is not None:
        log = RunLog.create(store, kind=params.kind, params=params.to_dict())
    run_id = log.run_id if log is not None else new_run_id(params.kind)
    if on_run is not None:
        on_run(run_id)
    started = time.perf_counter()
    reports: list[rp.GroupReport] = []
    s = setup.settings
    agents = AgentPool(
        setup.topology,
        token=setup.agent_token,
        timeout_s=s.connect_timeout,
        run_id=run_id,
        started_by=params.started_by,
    )
    run = RunState(
        setup=setup,
        params=params,
        run_id=run_id,
        log=log,
        agents=agents,
        progress=progress,
        key_sink=key_sink,
        keys=keys if resume is None else None,
    )
    beating = asyncio.create_task(_heartbeat(log)) if log is not None else None
    unchecked: list[dict[str, Any]] = []
    try:
        with _outcome_recorded(log, params.kind, run_id, setup.config_name):
            # Every member answers first, or nothing is scanned (the run is recorded as failed).
            await members_reachable(
                groups,
                timeout_s=s.connect_timeout,
                through_agent=run.through_agent,
                # …and lets this run's user do what it will (a missing ACL permission is
                # named now, not after the scans).
                mode="repair" if params.kind == "repair" and not params.dry_run else "check",
                prefix=s.prefix,
                advise=acl_mode,
            )
            for g in groups:
                with bind_log_fields(group=g.name):  # every line of this group's work
                    # A member behind an agent has its role read there.
                    shape = await group_shape(
                        g,
                        timeout_s=s.connect_timeout,
                        agents=[
                            agents.client_for(m) if run.through_agent(m) else None
                            for m in g.members
                        ],
                    )
                    policy = _policy(s.repair_outage_window, params, g, shape, store)
                    reports.append(await GroupRun(run, g, policy, shape).run())
            # What this run did not look at: databases with keys no group covers.
            unchecked = await unchecked_databases(
                setup.topology,
                groups,
                timeout_s=s.connect_timeout,
                skip={m.name for g in groups for m in g.members if run.through_agent(m)},
            )
    finally:
        if beating is not None:
            await cancel_all([beating])
        await agents.close()
    report = rp.RepairReport(
        run_id=run_id,
        kind=params.kind,
        group=params.group,
        policy=(params.policy or "by group kind") if params.kind == "repair" else None,
        dry_run=params.dry_run,
        allow_deletes=params.allow_deletes,
        status=DONE,
        groups=reports,
        seconds=time.perf_counter() - started,
        scan_rate=s.scan_rate or None,
        ttls=params.ttls,
        unchecked_databases=unchecked,
    )
    if log is not None:
        log.set_status(DONE, report=report.to_dict())
    return report


async def _heartbeat(log: RunLog) -> None:
    """Tell the store every HEARTBEAT_S that this process still runs the run: a run whose
    heartbeat stops is shown as owned by a dead instance (see `replag.repair.runs`)."""
    while True:
        try:
            await asyncio.to_thread(log.heartbeat)
        except StoreError as exc:
            logger.warning("run %s: heartbeat not stored: %s", log.run_id, exc)
        await asyncio.sleep(HEARTBEAT_S)


def _policy(
    window: float, params: RunParams, group: ReplicaGroup, shape: GroupShape, store: Store | None
) -> Policy:
    """The group's policy: --policy, or its kind's default, bound to what the run found (the
    primary; for Dynomite's majority, the members the probes saw cut off within `window`
    seconds, settings.repair_outage_window)."""
    since_ns = time.time_ns() - int(window * 1e9)
    names = {m.name for m in group.members}
    cut_off = tuple(sorted(names & cut_off_replicas(store, since_ns))) if store else ()
    return parse_policy(
        params.policy,
        group.members,
        kind=shape.kind,
        primary=shape.primary or 0,
        cut_off=cut_off,
        window=format_span(window),
    )


def _ttls(default: str, ttls: str | None) -> str:
    """--ttls, or `default` (settings.repair_ttls)."""
    if ttls is None:
        return default
    if ttls not in REPAIR_TTLS:
        raise UsageError(f"--ttls: expected one of {', '.join(REPAIR_TTLS)}, got {ttls!r}")
    return ttls


def _groups(topology: Topology, name: str | None, *, check: bool = True) -> list[ReplicaGroup]:
    """The replica group named (or every one); with `check`, each must have 2+ members."""
    groups = [topology.group(name)] if name else list(topology.groups)
    if not check:
        return groups
    if not groups:
        raise UsageError("the topology has no replica groups to compare ([[groups]])")
    for g in groups:
        if len(g.members) < 2:
            raise UsageError(
                f"replica group {g.name!r} has {count(len(g.members), 'member')}; need 2+"
            )
    return groups


def _resumed(
    config_name: str | None, kind: str, store: Store | None, resume: str
) -> tuple[RunLog, RunParams]:
    """The run `resume` to continue, and the parameters it was started with."""
    if store is None:
        raise UsageError("--resume needs the results store (settings.store)")
    log = RunLog(store, resume)
    row = log.row()
    if row is None:
        raise UsageError(f"--resume: no run {resume!r} in {store.shown}")
    saved_kind, status, saved = row
    if saved_kind != kind:
        again = resume_command(saved_kind, resume, config_name)
        raise UsageError(f"--resume: {resume} is a {saved_kind} run; resume it with `{again}`")
    if status == DONE:
        raise UsageError(f"--resume: run {resume} has already finished")
    return log, RunParams(**saved)


@contextlib.contextmanager
def _outcome_recorded(
    log: RunLog | None, kind: str, run_id: str, config_name: str | None
) -> Iterator[None]:
    """A run that stops early is recorded as failed (resumable: the error names the
    command) or interrupted, never left "running" in the store."""
    try:
        yield
    except EndpointError as exc:
        message = exc.message
        if log is not None:
            message += f"; resume with `{resume_command(kind, run_id, config_name)}`"
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


async def check(
    config: Config,
    *,
    group: str | None = None,
    store: Store | None = None,
    progress: ProgressCallback | None = None,
    match: str | None = None,
    type_filter: str | None = None,
    resume: str | None = None,
    on_run: Callable[[str], None] | None = None,
    key_sink: KeySink | None = None,
    ttls: str | None = None,
    started_by: dict[str, str] | None = None,
    acl_mode: Mode | None = None,
) -> rp.RepairReport:
    """Find the keys on which the members of `group` (None = every group) differ
    (`ttls`: "compare" or "ignore" expiries; default settings.repair_ttls; `started_by`:
    who asked through the API, stored with the run; `acl_mode`: the ACL recipe of the
    process running it, e.g. serve, which a missing permission's error suggests).

    `on_run(run_id)` is called once the run is recorded; `key_sink(group, key, dict)`
    with each divergent key as it is verified (resumed: those found before, first)."""
    params = RunParams(
        kind="check",
        group=group,
        policy=None,
        dry_run=True,
        allow_deletes=False,
        rate=None,
        max_inflight=config.settings.max_inflight,
        match=match,
        type_filter=type_filter,
        ttls=_ttls(config.settings.repair_ttls, ttls),
        started_by=started_by,
    )
    return await _run(
        RunSetup.of(config),
        params,
        store=store,
        resume=resume,
        progress=progress,
        on_run=on_run,
        key_sink=key_sink,
        acl_mode=acl_mode,
    )


async def repair(
    config: Config,
    *,
    group: str | None = None,
    policy: str | None = None,
    dry_run: bool = False,
    allow_deletes: bool = False,
    rate: float | None = None,
    max_inflight: int | None = None,
    resume: str | None = None,
    store: Store | None = None,
    progress: ProgressCallback | None = None,
    match: str | None = None,
    type_filter: str | None = None,
    on_run: Callable[[str], None] | None = None,
    ttls: str | None = None,
    started_by: dict[str, str] | None = None,
    acl_mode: Mode | None = None,
    keys: Sequence[bytes] | None = None,
) -> rp.RepairReport:
    """Find and repair divergence; see the module docstring of `policy` for the rules
    (`policy` None: each group's kind's default: primary, majority or quorum).
    A resumed run first reads again every key it had repaired. `ttls`, `started_by` and
    `acl_mode` as for `check`. `keys`: verify and repair only these keys of `group`, no
    scan (a rebuild's closing pass: what its copy left)."""
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
        ttls=_ttls(config.settings.repair_ttls, ttls),
        started_by=started_by,
    )
    return await _run(
        RunSetup.of(config),
        params,
        store=store,
        resume=resume,
        progress=progress,
        on_run=on_run,
        acl_mode=acl_mode,
        keys=keys,
    )


__all__ = ["ProgressCallback", "RepairProgress", "check", "key_from_json", "repair"]
