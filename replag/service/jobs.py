"""The job runner: checks and repairs started by the API or a scheduled check.

Jobs run on the jobs' own loop when the service runs (a check's CPU-bound
stretches then hold up neither the API nor the probes' observations), else
on the caller's. One job per group at a time: a job of every group excludes
all others, and any running job excludes one of every group.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from replag.alerts.health import record_check
from replag.background import BackgroundLoop
from replag.config import Config
from replag.errors import JobConflict, ReplagError, StoreError
from replag.metrics import ServiceMetrics
from replag.repair import RepairReport, check, repair
from replag.repair.decisions.policy import parse_policy
from replag.repair.exclusive import lease_name
from replag.service.job_table import JobTable
from replag.service.scheduler import Claim
from replag.settings import Settings
from replag.store import Store, leases
from replag.store.leases import instance_id
from replag.tracing import span

log = logging.getLogger("replag.service")

JobAction = Literal["check", "repair"]


@dataclass(kw_only=True)
class RepairJob:
    """A check or repair started by the API or the scheduler, tracked while it runs."""

    id: str
    action: JobAction
    group: str | None
    started_ns: int
    state: Literal["running", "done", "failed"] = "running"
    finished_ns: int | None = None
    run_id: str | None = None
    divergent: int | None = None
    # Keys whose values could not be compared (a module type): a run with any is not
    # clean, whatever `divergent` says.
    not_compared: int | None = None
    error: str | None = None
    # Who asked for it through the API: the token's name, the client's address, the job
    # id (None: the service's own schedule). Stored with the run too.
    started_by: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.id,
            "action": self.action,
            "group": self.group,
            "state": self.state,
            "started_ns": self.started_ns,
            "finished_ns": self.finished_ns,
            "run_id": self.run_id,
            "divergent": self.divergent,
            "not_compared": self.not_compared,
            "error": self.error,
            "started_by": self.started_by,
        }


class JobRunner:
    """Starts, tracks and waits for checks and repairs; `loop` is set while the service runs."""

    config: Config
    job_config: Config
    settings: Settings

    def configure(self, config: Config) -> None:
        """Jobs started from now on run under `config` (at start, and on a reload)."""
        self.config = config
        # The service's checks and repairs share the host (and the servers) with the API,
        # the probes and the replicas' clients: they read at service_scan_rate.
        self.job_config = dataclasses.replace(
            config,
            settings=dataclasses.replace(
                config.settings, scan_rate=config.settings.service_scan_rate
            ),
        )
        self.settings = config.settings

    def __init__(
        self,
        config: Config,
        *,
        store: Store,
        metrics: ServiceMetrics,
        counters: Counter[str],
    ) -> None:
        self.configure(config)
        self.store = store
        self.metrics = metrics
        self.counters = counters
        self.jobs: dict[str, RepairJob] = {}
        # Started jobs not finished yet: tasks of the jobs loop (or of the caller's loop when
        # the schedules do not run).
        self._tasks: dict[str, concurrent.futures.Future[None] | asyncio.Future[None]] = {}
        self.lock = threading.Lock()  # start() runs on the API's and the schedules' loops
        self.loop: BackgroundLoop | None = None
        # The job table in the store, while the service runs (several instances may).
        self.table: JobTable | None = None
        # Group (None: every group) → the id of the job holding it.
        self._busy: dict[str | None, str] = {}

    def start(
        self,
        action: JobAction,
        group: str | None,
        *,
        started_by: Callable[[str], dict[str, str]] | None = None,
        job_id: str | None = None,
        resume: str | None = None,
        **options: Any,
    ) -> RepairJob:
        """Start a check or repair in the background; `started_by(job_id)` says who asked
        (recorded on the job and stored with its run). `job_id` and `resume`: a job of a
        dead instance, resumed here from its run's checkpoint.

        Raises JobConflict while a job of the same group, or of every group, runs (a job
        of every group conflicts with any), and UsageError for an unknown group or a
        policy the repair library would refuse, so the caller hears of it now.
        """
        if group is not None:
            self.config.topology.group(group)  # UsageError naming the known groups
        if action == "repair":
            self._check_policy(group, options.get("policy"))
        job_id = job_id or uuid.uuid4().hex[:12]
        job = RepairJob(
            id=job_id,
            action=action,
            group=group,
            started_ns=time.time_ns(),
            started_by=started_by(job_id) if started_by is not None else None,
            run_id=resume,
        )
        self._refuse_if_held_elsewhere(group)
        with self.lock:
            running = [g for g in self._busy if group is None or g is None or g == group]
            if running:
                what = running[0] or "every group"
                raise JobConflict(f"a check or repair of {what} is already running")
            self._busy[group] = job.id
            self.jobs[job.id] = job
            self._prune()
        if self.table is not None:
            self.table.started(job.id, action, group, options, created_ns=job.started_ns)
        coro = self._run(job, options, resume=resume)
        future: concurrent.futures.Future[None] | asyncio.Future[None] = (
            self.loop.submit(coro) if self.loop is not None else asyncio.ensure_future(coro)
        )
        self._tasks[job.id] = future

        def finished(_: object) -> None:
            with self.lock:
                self._tasks.pop(job.id, None)
                if self._busy.get(group) == job.id:  # also when cancelled before it started
                    del self._busy[group]

        future.add_done_callback(finished)
        return job

    def _refuse_if_held_elsewhere(self, group: str | None) -> None:
        """JobConflict (HTTP 409) now when another process runs a check or repair of the
        group (its lease, `replag.repair.exclusive`); the run itself checks again."""
        names = {lease_name(g.name) for g in self.config.topology.groups}
        if group is not None:
            names = {lease_name(group)}
        me = instance_id()
        for lease in leases.current(self.store, prefix="repair:"):
            if lease.name in names and lease.holder != me:
                raise JobConflict(
                    f"a check or repair of group {lease.name.removeprefix('repair:')} is "
                    f"already running (held by {lease.holder})"
                )

    def _check_policy(self, group: str | None, policy: str | None) -> None:
        """Parse `policy` for every group the job covers, as the repair will (UsageError)."""
        groups = [self.config.topology.group(group)] if group else self.config.topology.groups
        for g in groups:
            parse_policy(policy, g.members, kind=g.kind)

    async def wait(self, job_id: str) -> RepairJob:
        """Wait (from any loop) for a started job to end; a cancelled wait leaves it running."""
        future = self._tasks.get(job_id)
        if isinstance(future, concurrent.futures.Future):
            await asyncio.shield(asyncio.wrap_future(future))
        elif future is not None:
            await asyncio.shield(future)
        return self.jobs[job_id]

    async def cancel_local(self) -> None:
        """Cancel and await the jobs running on the caller's loop (started without `loop`)."""
        local = [f for f in self._tasks.values() if isinstance(f, asyncio.Future)]
        for task in local:
            task.cancel()
        await asyncio.gather(*local, return_exceptions=True)

    def running_count(self) -> int:
        return sum(j.state == "running" for j in self.jobs.values())

    async def _run(
        self, job: RepairJob, options: dict[str, Any], *, resume: str | None = None
    ) -> None:
        """Run `job` (its group is already claimed in `_busy`), then an auto-repair if due."""
        group_label = job.group or "all"
        table = self.table

        def recorded(run_id: str) -> None:
            job.run_id = run_id
            if table is not None:
                table.run_recorded(job.id, run_id)

        try:
            with span(f"replag.{job.action}", replag__group=group_label, replag__job=job.id):
                report = await self._report(job, options, resume, recorded)
            job.run_id, job.divergent = report.run_id, int(report.divergent)
            job.not_compared = report.not_compared_keys
            job.state = "done"
            self._observe(job, report)
        except ReplagError as exc:
            self._failed(job, str(exc))
            log.warning("%s of %s failed: %s", job.action, group_label, exc)
            return
        except Exception as exc:
            # A bug or an unexpected network error (ConnectionResetError…) must not leave
            # the job "running" forever nor stop the next group's check.
            self.counters["crashed jobs"] += 1
            self._failed(job, f"{type(exc).__name__}: {exc}")
            log.exception("%s of %s crashed", job.action, group_label)
            return
        finally:
            job.finished_ns = time.time_ns()
            self._store_outcome(job)
        self.counters[f"{job.action}s"] += 1
        if job.divergent:
            outcome = "divergent"
        elif job.not_compared or report.not_clean:
            outcome = "not_clean"
        else:  # a read refused, a Cluster shard changed: the check could not vouch for it
            outcome = "not_verified" if report.not_verified else "clean"
        self.metrics.repair_runs.labels(group_label, job.action, outcome).inc()
        self.metrics.last_success.labels(job.action, group_label).set(time.time())
        if job.action == "check" and job.group and job.divergent and self.settings.auto_repair:
            log.warning("group %s: %d divergent keys, auto-repairing", job.group, job.divergent)
            follow = RepairJob(
                id=uuid.uuid4().hex[:12],
                action="repair",
                group=job.group,
                started_ns=time.time_ns(),
            )
            with self.lock:
                self.jobs[follow.id] = follow
            await self._run(follow, {})

    async def _report(
        self,
        job: RepairJob,
        options: dict[str, Any],
        resume: str | None,
        recorded: Callable[[str], None],
    ) -> RepairReport:
        """The check or repair `job` names, run (a resumed one from its run's record)."""
        if job.action == "check":
            return await check(
                self.job_config,
                group=None if resume else job.group,
                store=self.store,
                ttls=options.get("ttls"),
                resume=resume,
                on_run=recorded,
                started_by=job.started_by,
                acl_mode="serve",
            )
        if resume is not None:
            return await repair(
                self.job_config,
                store=self.store,
                resume=resume,
                on_run=recorded,
                started_by=job.started_by,
                acl_mode="serve",
            )
        return await repair(
            self.job_config,
            group=job.group,
            store=self.store,
            on_run=recorded,
            started_by=job.started_by,
            acl_mode="serve",
            **options,
        )

    def _store_outcome(self, job: RepairJob) -> None:
        """The job's row says how it ended (a cancelled job stays running: resumable)."""
        if self.table is None or job.state == "running" or job.finished_ns is None:
            return
        try:
            self.table.finished(
                job.id,
                state=job.state,
                finished_ns=job.finished_ns,
                divergent=job.divergent,
                error=job.error,
            )
        except StoreError as exc:
            log.warning("job %s: outcome not stored (%s)", job.id, exc)

    def _failed(self, job: RepairJob, error: str) -> None:
        job.state, job.error = "failed", error
        self.metrics.repair_runs.labels(job.group or "all", job.action, "error").inc()
        if job.group:
            record_check(self.store, group=job.group, divergent=None, run_id=None, error=error)

    def _observe(self, job: RepairJob, report: RepairReport) -> None:
        """Per-group figures of a RepairReport: divergent keys, repair outcomes, group health."""
        for group in report.groups:
            if job.action == "check" or not report.dry_run:
                self.metrics.divergent.labels(group.group).set(group.divergent)
                self.metrics.not_compared.labels(group.group).set(
                    sum(row["keys"] for row in group.not_compared)
                )
                for row in group.slot_counts:
                    labels = (group.group, row["member"])
                    self.metrics.slot_count_slots.labels(*labels).set(row["slots_differing"])
                    self.metrics.slot_count_keys.labels(*labels).set(row["key_difference"])
                record_check(
                    self.store,
                    group=group.group,
                    divergent=group.divergent,
                    run_id=report.run_id,
                    error=None,
                )
            for outcome, count in group.outcomes.items():
                self.metrics.repaired_keys.labels(group.group, outcome).inc(count)

    def _prune(self, keep: int = 200) -> None:
        finished = [j for j in self.jobs.values() if j.state != "running"]
        for job in finished[: max(0, len(self.jobs) - keep)]:
            del self.jobs[job.id]


class OrphanAdoption:
    """Every instance, every third of `lease_time`: claim a job whose instance died and
    resume its run from its checkpoint (`replag.service.job_table`)."""

    name = "jobs"
    claim: Claim = "every"

    def __init__(self, jobs: JobRunner) -> None:
        self.jobs = jobs
        self.interval_s = jobs.settings.lease_time / 3

    async def run(self, fence: object = None) -> None:
        table = self.jobs.table
        if table is None:
            return
        orphan = await asyncio.to_thread(table.claim_orphan)
        if orphan is None:
            return
        action: JobAction = "repair" if orphan.action == "repair" else "check"
        options = {} if orphan.run_id else orphan.options
        try:
            job = self.jobs.start(
                action, orphan.group, job_id=orphan.id, resume=orphan.run_id, **options
            )
        except JobConflict as exc:
            # The dead instance's lease on the group outlives its instance lease by up to
            # a renewal: give the job back and claim it again once that lease expires.
            await asyncio.to_thread(table.give_back, orphan)
            log.info("job %s of a dead instance waits for its group: %s", orphan.id, exc)
            return
        log.warning(
            "job %s (%s of %s) was %s's, which died: resuming %s",
            orphan.id,
            orphan.action,
            orphan.group or "every group",
            orphan.previous_owner,
            f"run {orphan.run_id} from its checkpoint" if orphan.run_id else "it from the start",
        )
        self.jobs.counters["jobs resumed"] += 1
        await self.jobs.wait(job.id)
