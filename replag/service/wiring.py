"""The long-running service: builds the scheduled units and wires them to one store.

`ReplagService` owns what the units share (the store, the lag index, the
metrics, the alert evaluation, the job runner, the replication state) and
builds one unit per piece of periodic work: a `ProbeRound` per region with a
write endpoint, `ReplicationSampling`, `DynomiteStatsRound`, a
`ScheduledCheck` per replica group and `RetentionRound`. `start()` runs them
on a scheduler on a loop of its own (`replag-schedules`) and jobs on another
(`replag-jobs`), away from the API's; `stop()` cancels and awaits them and
closes what they opened. FastAPI's lifespan calls both (see `replag.api.app`);
the API reads through the same object, so what it shows is what the units stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replag.alerts.evaluate import AlertBook, AlertSender
from replag.alerts.health import probe_health
from replag.alerts.verdict import (
    HealthVerdict,
    replication_health,
    with_replication_problems,
    with_store_problems,
)
from replag.background import BackgroundLoop
from replag.config import Config
from replag.errors import ReplagError, StoreError
from replag.heap import freeze_long_lived
from replag.lagindex import LagIndex
from replag.metrics import ServiceMetrics
from replag.probes.report import ProbeReport
from replag.probes.runner import run_probe
from replag.replication.rpo import FailoverAssessment
from replag.replication.state import PrimaryState
from replag.service.alerting import AlertEvaluation
from replag.service.checks import ScheduledCheck
from replag.service.dynomite import DynomiteStatsRound
from replag.service.findings import RoundFindings
from replag.service.job_table import JobTable
from replag.service.jobs import JobAction, JobRunner, OrphanAdoption, RepairJob
from replag.service.leasing import INSTANCE_PREFIX, OFFER_PREFIX, LeaseKeeper
from replag.service.probing import ProbeFunction, ProbeRound
from replag.service.reload import probe_unchanged
from replag.service.replication import ReplicationSampling, ReplicationState
from replag.service.retention import RetentionRound
from replag.service.scheduler import ScheduledUnit, Scheduler
from replag.service.slots import SlotClaims
from replag.settings import Settings
from replag.store import Store, leases
from replag.store.backlog import HoldLimits
from replag.store.leases import instance_id
from replag.topology import Region

if TYPE_CHECKING:
    from replag.otlp import OtlpExport

log = logging.getLogger("replag.service")

# How often the service picks up new lag windows for the API (a probe round's windows
# are picked up at its end too, by the alert evaluation).
INDEX_FOLLOW_S = 0.25
# The alert history the API shows by default (GET /api/v1/alerts?history=50).
ALERT_HISTORY_SHOWN = 50


def hold_limits(settings: Settings) -> HoldLimits:
    """What the service's store holds while it cannot be written (settings store_hold_*)."""
    return HoldLimits(
        memory_bytes=settings.store_hold_memory_mb * 1024 * 1024,
        disk_bytes=settings.store_hold_disk_mb * 1024 * 1024,
        spill_dir=Path(settings.store_spill_dir).expanduser(),
    )


class ReplagService:
    def __init__(
        self,
        config: Config,
        *,
        store: Store | None = None,
        probe: ProbeFunction | None = None,
        external_url: str = "",
        freeze_heap: bool = False,
    ) -> None:
        """`freeze_heap`: once the index is warm, move the process's long-lived objects out
        of the garbage collector's passes (see `replag.heap`); `replag serve` sets it."""
        self.config = config
        self.settings = config.settings
        self.config_version = 0  # raised by every reload (answers cached per configuration)
        self._freeze_heap = freeze_heap
        self.store = store or Store(config.settings.store)
        self._own_store = store is None
        if self._own_store:
            try:  # damaged pages are found now, in one line, not as 500s later
                self.store.check_integrity()
            except BaseException:
                self.store.close()
                raise
        self.store.hold(hold_limits(config.settings))
        self.metrics = ServiceMetrics(lag_buckets_per_decade=config.settings.lag_buckets_per_decade)
        self.metrics.watch_store(self.store)
        self.otlp: OtlpExport | None = None
        self.counters: Counter[str] = Counter()
        self.index = LagIndex(self.store)
        self.started_ns = time.time_ns()
        self._alerts_read = 0.0  # monotonic: when the alert states were last read
        self.alerts = AlertEvaluation(
            config,
            index=self.index,
            external_url=external_url,
            store=self.store,
            metrics=self.metrics,
            counters=self.counters,
        )
        self.job_runner = JobRunner(
            config, store=self.store, metrics=self.metrics, counters=self.counters
        )
        self.replication = ReplicationState(config, store=self.store, metrics=self.metrics)
        self.findings = RoundFindings(
            config,
            store=self.store,
            metrics=self.metrics,
            verdicts=self.replication.verdicts,
            problems=lambda: self.health_verdict().problems,
        )
        evaluate = self.after_round
        self._probe = probe or run_probe
        self.probe_rounds = [
            self._probe_round(config, region)
            for region in config.topology.regions
            if region.write is not None
        ]
        self.replication_sampling = ReplicationSampling(
            self.replication, counters=self.counters, evaluate_alerts=evaluate
        )
        self.dynomite = DynomiteStatsRound(
            config,
            evaluate_alerts=evaluate,
            store=self.store,
            metrics=self.metrics,
            counters=self.counters,
        )
        self._check_turns = asyncio.Semaphore(1)
        self.checks = [self._check(g.name) for g in config.topology.groups]
        self.retention = RetentionRound(
            self.settings, store=self.store, index=self.index, alert_book=self.alerts.book
        )
        self.scheduler = Scheduler(self.units(), counters=self.counters)
        self.instance = instance_id()
        self.keeper: LeaseKeeper | None = None  # from start() to stop()
        # Own event loops in own threads (replag.background), from start() to stop(): the
        # scheduled units (with alert evaluation and delivery), and the checks and repairs.
        self._schedules: BackgroundLoop | None = None
        self._jobs_loop: BackgroundLoop | None = None

    def _probe_round(self, config: Config, region: Region) -> ProbeRound:
        assert region.write is not None
        return ProbeRound(
            config,
            source=region.name,
            write_name=region.write.name,
            probe=self._probe,
            replication=self.replication,
            evaluate_alerts=self.after_round,
            store=self.store,
            metrics=self.metrics,
            counters=self.counters,
        )

    def _check(self, group: str) -> ScheduledCheck:
        return ScheduledCheck(
            group,
            jobs=self.job_runner,
            turns=self._check_turns,
            evaluate_alerts=self.after_round,
        )

    async def apply_config(self, new: Config) -> None:
        """Run under `new` from now on (`replag.service.reload` decides it may): the units
        whose part of the configuration did not change run on undisturbed, the others
        stop, restart or start; what was measured and the alert state carry on."""
        old = self.config
        kept = {u.source: u for u in self.probe_rounds if probe_unchanged(old, new, u.source)}
        same_checks = old.settings.check_interval == new.settings.check_interval
        checks = {c.group: c for c in self.checks} if same_checks else {}
        self.config, self.settings = new, new.settings
        self.config_version += 1
        self.job_runner.configure(new)
        self.replication.config, self.replication.settings = new, new.settings
        self.findings.config = new
        self.replication_sampling.interval_s = new.settings.replication_interval
        self.dynomite.config, self.dynomite.settings = new, new.settings
        self.dynomite.interval_s = new.settings.probe_interval
        self.alerts.reconfigure(new)
        self.retention.settings = new.settings
        self.probe_rounds = [
            kept.get(r.name) or self._probe_round(new, r)
            for r in new.topology.regions
            if r.write is not None
        ]
        self.checks = [checks.get(g.name) or self._check(g.name) for g in new.topology.groups]
        units = self.units()
        if self._schedules is not None:
            await self._schedules.run(self.scheduler.replace(units))
        else:
            self.scheduler.units = units

    def units(self) -> list[ScheduledUnit]:
        """Every unit this service's configuration calls for."""
        units: list[ScheduledUnit] = [
            *self.probe_rounds,
            self.alerts,
            *self.checks,
            self.retention,
            OrphanAdoption(self.job_runner),
        ]
        if self.replication.targets():
            units.append(self.replication_sampling)
        if self.settings.dynomite_stats_urls:
            units.append(self.dynomite)
        return units

    # --- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Start the schedules on loops of their own, away from the API's (see stop())."""
        self.started_ns = time.time_ns()
        self.index.serve_recent = True
        self._jobs_loop = BackgroundLoop("replag-jobs").start()
        self.job_runner.loop = self.replication.rebuild_on = self._jobs_loop
        # Several instances may share the store: every scheduled unit is owned through a
        # lease or claimed per slot (replag.service.scheduler).
        units = self.scheduler.units
        self.keeper = LeaseKeeper(
            self.store,
            holder=self.instance,
            ttl_s=self.settings.lease_time,
            units=sum(u.claim == "lease" for u in units),
        )
        self.scheduler.keeper = self.alerts.keeper = self.replication.keeper = self.keeper
        # The replication series are the sampling unit's owner's (see ReplicationCollector).
        self.metrics.replication.exported = False
        self.scheduler.slots = SlotClaims(self.store, holder=self.instance)
        self.job_runner.table = JobTable(self.store, holder=self.instance)
        self._schedules = BackgroundLoop("replag-schedules").start()
        await self._schedules.call(self._start_schedules)
        if self.settings.otlp_endpoint and self.otlp is None:
            from replag.otlp import OtlpExport  # the otel extra: imported only when asked for

            self.otlp = OtlpExport(
                self.metrics,
                endpoint=self.settings.otlp_endpoint,
                interval_s=self.settings.otlp_interval,
                instance=self.instance,
            )

    def _start_schedules(self) -> None:
        # Decode the last day of windows off the event loop, before the dashboard asks.
        day_ago = time.time_ns() - 86_400 * 10**9
        self.scheduler.spawn("index-warmup", self._warm_index(since_ns=day_ago))
        self.scheduler.spawn("index-follow", self._follow_index())
        # The matrix's replication cells, before the first request needs them.
        self.scheduler.spawn("replication-cells", asyncio.to_thread(self.replication.cells))
        self.index.followed = True
        self.scheduler.start()
        log.info(
            "service started: probing %s every %gs, checking %d groups every %gs, "
            "reading %d Dynomite nodes' /info",
            ", ".join(p.source for p in self.probe_rounds) or "nothing",
            self.settings.probe_interval,
            len(self.config.topology.groups),
            self.settings.check_interval,
            len(self.settings.dynomite_stats_urls),
        )

    async def _warm_index(self, *, since_ns: int) -> None:
        try:
            await asyncio.to_thread(self.index.warm, since_ns=since_ns)
        except ReplagError as exc:
            # Observed, not a silently dead task: health names it and the lag API's answers
            # say they are not fresh (see LagIndex.load_error).
            log.error("lag index warm-up failed: %s", exc)
            return
        if self._freeze_heap:
            freeze_long_lived("index warm-up")

    async def _follow_index(self) -> None:
        """Pick up new windows (this instance's and others') every INDEX_FOLLOW_S, in a
        thread: the API's queries then never read the store on its event loop."""
        while True:
            try:
                await asyncio.to_thread(self._refresh_index)
            except ReplagError as exc:  # named by health and the lag API (load_error)
                log.debug("lag index refresh: %s", exc)
            await asyncio.sleep(INDEX_FOLLOW_S)

    def _refresh_index(self) -> None:
        self._read_alert_states()
        self.index.refresh()
        self.index.decode_new()

    def _read_alert_states(self) -> None:
        """Read what the alerts API shows now and then (every `probe_interval`), so that it
        answers from what was last read while the store is away."""
        now = time.monotonic()
        if now - self._alerts_read < self.settings.probe_interval or not self.store.reachable:
            return
        self._alerts_read = now
        try:
            self.alerts.book.active()
            self.alerts.book.history(limit=ALERT_HISTORY_SHOWN)
            self.alerts.book.firing_count()
            self.alerts.sender.statuses()
        except StoreError as exc:
            log.debug("alert states not read: %s", exc)

    async def stop(self) -> None:
        """Cancel and await the schedules, jobs and alert deliveries; close the store."""
        if self._schedules is not None:
            await self._schedules.call(self.scheduler.stop)
        if self.keeper is not None:
            # Hand the units over now, not after the rounds under way wind down: another
            # instance takes each within half its interval (their fences stop these rounds).
            await asyncio.to_thread(self.keeper.release_all)
        if self._schedules is not None:
            # The sender's session and workers, and the sampler's connections, live on the
            # schedules' loop: closed there, before it ends.
            await self._schedules.run(self._close_clients())
        for background in (self._schedules, self._jobs_loop):  # schedules first: no new jobs
            if background is not None:
                await background.stop()
        self._schedules = self._jobs_loop = None
        self.index.followed = False
        self.job_runner.loop = self.replication.rebuild_on = None
        if self.keeper is not None:  # others take over at once, not after the lease time
            await asyncio.to_thread(self.keeper.release_all)
            self.keeper = self.scheduler.keeper = self.alerts.keeper = None
            self.job_runner.table = None
            self.replication.keeper = None
        await self.job_runner.cancel_local()
        self.scheduler.clear()
        await self._close_clients()
        if self.otlp is not None:  # what is pending goes out before the process ends
            await asyncio.to_thread(self.otlp.shutdown)
            self.otlp = None
        if self._own_store:
            self.store.close()
        summary = ", ".join(f"{k} {v}" for k, v in sorted(self.counters.items())) or "nothing done"
        log.info("service stopped: %s", summary)

    async def _close_clients(self) -> None:
        await self.alerts.sender.close()
        await self.replication_sampling.close()

    @property
    def _tasks(self) -> list[asyncio.Task[None]]:
        return self.scheduler.tasks

    # --- rounds, as the units run them (tests and library users call these) ----

    async def probe_round(self) -> list[ProbeReport]:
        """Probe from every region with a write endpoint, one after the other, then alert."""
        reports = [r for unit in self.probe_rounds if (r := await unit.probe()) is not None]
        await self.evaluate_alerts()
        return reports

    async def replication_round(self) -> None:
        await self.replication_sampling.run()

    async def dynomite_round(self) -> None:
        await self.dynomite.run()

    async def check_round(self) -> None:
        """Check every group in turn (skipping busy ones), then evaluate the alerts."""
        for unit in self.checks:
            await unit.check()
        await self.evaluate_alerts()

    async def prune_round(self) -> None:
        await self.retention.run()

    async def evaluate_alerts(self) -> None:
        await self.alerts.evaluate()

    async def after_round(self) -> None:
        """After each unit's round: adopt the latest runs (a CLI repair's too), log what
        changed, evaluate the alerts."""
        await self.findings.after_round()
        await self.alerts.after_round()

    # --- what the API reads ------------------------------------------------------

    @property
    def alert_book(self) -> AlertBook:
        return self.alerts.book

    @property
    def sender(self) -> AlertSender:
        return self.alerts.sender

    @property
    def jobs(self) -> dict[str, RepairJob]:
        return self.job_runner.jobs

    def start_job(self, action: JobAction, group: str | None, **options: Any) -> RepairJob:
        return self.job_runner.start(action, group, **options)

    async def wait_job(self, job_id: str) -> RepairJob:
        return await self.job_runner.wait(job_id)

    def latest_replication(self) -> list[PrimaryState]:
        return self.replication.latest_primaries()

    def failover_assessment(self, primary: PrimaryState, *, now_ns: int) -> FailoverAssessment:
        return self.replication.failover_assessment(primary, now_ns=now_ns)

    def replication_status(self) -> dict[str, Any]:
        return self.replication.status()

    def recent_replication_cells(self) -> list[dict[str, Any]] | None:
        return self.replication.recent_cells()

    def replication_cells(self) -> list[dict[str, Any]]:
        return self.replication.cells()

    def dynomite_status(self) -> dict[str, Any]:
        return self.dynomite.status()

    def health_verdict(self) -> HealthVerdict:
        """The replication verdict now (`replag.alerts.verdict`), with the store's, the
        replication samples' and the latest checks' problems."""
        unseen: frozenset[str] = frozenset()
        if self.keeper is not None and not self.store.reachable:
            mine = set(self.keeper.held_names())
            unseen = frozenset(p.source for p in self.probe_rounds if p.name not in mine)
        verdict = replication_health(
            self.config,
            self.index,
            now_ns=time.time_ns(),
            alerts_firing=self.alerts.book.firing_count(),
            unseen=unseen,
        )
        verdict = with_store_problems(verdict, self.store, self.index)
        return with_replication_problems(
            verdict,
            self.replication.latest_primaries(),
            self.replication.check_verdicts(),
            groups={g.name for g in self.config.topology.groups},
            now_ns=time.time_ns(),
            group_verdicts=self.replication.group_verdicts(),
        )

    def health(self) -> dict[str, Any]:
        """The replication verdict now (`replag.alerts.verdict`) and the service's state."""
        probes = {name: h.to_dict() for name, h in probe_health(self.store).items()}
        verdict = self.health_verdict()
        return {
            **verdict.to_dict(),
            "store": {"location": self.store.shown, **self.store.health.to_dict()},
            "started_ns": self.started_ns,
            "uptime_s": round((time.time_ns() - self.started_ns) / 1e9, 3),
            "probe_interval_s": self.settings.probe_interval,
            "check_interval_s": self.settings.check_interval,
            "auto_repair": self.settings.auto_repair,
            "probes": probes,
            "jobs_running": self.job_runner.running_count(),
            "instance": self.instance,
            "instances": self.instances(),
        }

    def instances(self) -> list[dict[str, Any]]:
        """Every live instance on this store and the units it owns: as the lease keeper's
        last heartbeat read them, with this instance's own from memory (no store read on
        a request: it answers while the store is away)."""
        if self.keeper is not None:
            mine = set(self.keeper.held_names())
            owned = {
                holder: [n for n in names if n not in mine]
                for holder, names in self.keeper.owners.items()
            }
            owned[self.instance] = sorted(mine)
        else:
            owned = {}
            for lease in leases.current(self.store):
                if lease.name.startswith(INSTANCE_PREFIX):
                    owned.setdefault(lease.holder, [])
                elif not lease.name.startswith(OFFER_PREFIX):
                    owned.setdefault(lease.holder, []).append(lease.name)
        return [
            {"instance": holder, "this": holder == self.instance, "owns": sorted(names)}
            for holder, names in sorted(owned.items())
        ]
