"""The long-running service: one object owning the store, the schedulers and the alert sender.

`ReplagService.start()` launches the probe scheduler (every region with a write
endpoint, every `probe_interval`), the repair-check scheduler (every replica
group, every `check_interval`, repairing when `auto_repair` is on), the
Dynomite stats collector (every `dynomite_stats_urls` node's /info, every
`probe_interval`), the replication sampler (every primary's and replica's INFO
replication, every `replication_interval`) and the alert sender's workers;
`stop()` cancels and awaits them and closes what they opened. FastAPI's lifespan calls both (see
`replag.api.app`); the API reads through the same object, so what it shows is
what the schedulers stored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from replag.alerts.evaluate import AlertBook, AlertSender, DeliveryResult, evaluate_and_notify
from replag.alerts.health import probe_health, record_check, record_probe
from replag.alerts.rules import dropped_writes_since
from replag.alerts.thresholds import headroom_bands
from replag.alerts.verdict import replication_health
from replag.background import BackgroundLoop
from replag.config import Config
from replag.errors import EndpointError, JobConflict, ReplagError
from replag.heap import freeze_long_lived
from replag.lagindex import LagIndex
from replag.metrics import ServiceMetrics
from replag.monitoring.dynomite_figures import FIGURES
from replag.monitoring.dynomite_stats import collect_dynomite_stats, prune_stats, recent_stats
from replag.probes.report import ProbeReport
from replag.probes.runner import run_probe
from replag.repair import RepairReport, check, repair
from replag.repair.policy import parse_policy
from replag.replication import history as replication_history
from replag.replication.check import recent_lag_p99_ms
from replag.replication.follow import endpoint_at
from replag.replication.rpo import FailoverAssessment, assess_failover
from replag.replication.sampler import ReplicationSampler, SampleTarget, replication_targets
from replag.replication.state import PrimaryState, ReplicationSnapshot
from replag.store import Store

log = logging.getLogger(__name__)
REPLICATION_CELLS_MAX_AGE_S = 0.5

ProbeFunction = Callable[..., Awaitable[ProbeReport]]
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
    error: str | None = None

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
            "error": self.error,
        }


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
        # The service's checks and repairs share the host (and the servers) with the API,
        # the probes and the replicas' clients: they read at service_scan_rate.
        self.job_config = dataclasses.replace(
            config,
            settings=dataclasses.replace(
                config.settings, scan_rate=config.settings.service_scan_rate
            ),
        )
        self._freeze_heap = freeze_heap
        self.settings = config.settings
        self.store = store or Store(config.settings.store)
        self._own_store = store is None
        self.metrics = ServiceMetrics()
        self.index = LagIndex(self.store)
        self.alert_book = AlertBook(self.store)
        self.sender = AlertSender(
            config.alerts.sinks,
            self.store,
            external_url=external_url,
            on_result=self._count_delivery,
        )
        self._probe = probe or run_probe
        self.started_ns = time.time_ns()
        self.jobs: dict[str, RepairJob] = {}
        self.counters: Counter[str] = Counter()
        self._tasks: list[asyncio.Task[None]] = []
        # Started jobs not finished yet: tasks of the jobs loop (or of the caller's loop when
        # the schedules do not run).
        self._job_tasks: dict[str, concurrent.futures.Future[None] | asyncio.Future[None]] = {}
        self._job_lock = threading.Lock()  # start_job runs on the API's and the schedules' loops
        # Own event loops in own threads (replag.background), from start() to stop(): the
        # probe schedule (with alert evaluation and delivery) and the checks and repairs.
        self._schedules: BackgroundLoop | None = None
        self._jobs_loop: BackgroundLoop | None = None
        # Group (None: every group) → the id of the job holding it. A job of every group
        # excludes all others, and any running job excludes one of every group.
        self._busy: dict[str | None, str] = {}
        self._stopping = asyncio.Event()
        # The last Dynomite collection (the samples themselves are in the store).
        self.dynomite_collected_ns: int | None = None
        self.dynomite_errors: dict[str, str] = {}
        # (source, replica) pairs whose last probe saw nothing: logged once per spell.
        self._silent: set[tuple[str, str]] = set()
        # Replication state: the latest sample of each (source, primary), from the probe
        # runs and the service's own rounds (every `replication_interval`).
        self.replication_sampler = ReplicationSampler(timeout_s=config.settings.connect_timeout)
        self.replication_latest: dict[tuple[str, str], PrimaryState] = {}
        # The matrix's replication cells, with the monotonic moment they were built.
        self._replication_cells: tuple[float, list[dict[str, Any]]] | None = None
        self._replication_cells_rebuilding = False
        self.metrics.replication.expect(
            (t.source, t.primary.name, [(region, ep.name) for region, ep in t.replicas])
            for t in self.replication_targets()
        )

    # --- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Start the schedules on loops of their own, away from the API's (see stop())."""
        self.started_ns = time.time_ns()
        self.index.serve_recent = True
        self._jobs_loop = BackgroundLoop("replag-jobs").start()
        self._schedules = BackgroundLoop("replag-schedules").start()
        await self._schedules.call(self._start_schedules)

    def _start_schedules(self) -> None:
        self._stopping.clear()
        sources = [r.name for r in self.config.topology.regions if r.write is not None]
        # Decode the last day of windows off the event loop, before the dashboard asks.
        day_ago = time.time_ns() - 86_400 * 10**9
        self._spawn("index-warmup", self._warm_index(since_ns=day_ago))
        if sources:
            self._spawn(
                "probe-scheduler", self._every(self.settings.probe_interval, self.probe_round)
            )
        if self.config.topology.groups:
            self._spawn(
                "check-scheduler", self._every(self.settings.check_interval, self.check_round)
            )
        self._spawn("retention", self._every(3600.0, self.prune_round))
        if self.replication_targets():
            self._spawn(
                "replication-sampler",
                self._every(self.settings.replication_interval, self.replication_round),
            )
        if self.settings.dynomite_stats_urls:
            self._spawn(
                "dynomite-stats", self._every(self.settings.probe_interval, self.dynomite_round)
            )
        log.info(
            "service started: probing %s every %gs, checking %d groups every %gs, "
            "reading %d Dynomite nodes' /info",
            ", ".join(sources) or "nothing",
            self.settings.probe_interval,
            len(self.config.topology.groups),
            self.settings.check_interval,
            len(self.settings.dynomite_stats_urls),
        )

    async def _warm_index(self, *, since_ns: int) -> None:
        await asyncio.to_thread(self.index.warm, since_ns=since_ns)
        if self._freeze_heap:
            freeze_long_lived("index warm-up")

    async def stop(self) -> None:
        """Cancel and await the schedules, jobs and alert deliveries; close the store."""
        if self._schedules is not None:
            # The sender's session and workers, and the sampler's connections, live on the
            # schedules' loop: closed there, before it ends.
            await self._schedules.run(self._close_clients())
        for background in (self._schedules, self._jobs_loop):  # schedules first: no new jobs
            if background is not None:
                await background.stop()
        self._schedules = self._jobs_loop = None
        local = [f for f in self._job_tasks.values() if isinstance(f, asyncio.Future)]
        for task in local:
            task.cancel()
        await asyncio.gather(*local, return_exceptions=True)
        self._tasks.clear()
        await self._close_clients()
        if self._own_store:
            self.store.close()
        summary = ", ".join(f"{k} {v}" for k, v in sorted(self.counters.items())) or "nothing done"
        log.info("service stopped: %s", summary)

    async def _close_clients(self) -> None:
        await self.sender.close()
        await self.replication_sampler.close()

    def _spawn(self, name: str, coro: Awaitable[Any]) -> None:
        self._tasks.append(asyncio.ensure_future(coro))
        self._tasks[-1].set_name(name)

    async def _every(self, interval_s: float, step: Callable[[], Awaitable[Any]]) -> None:
        """Run `step` now and then every `interval_s`, keeping the loop alive through failures."""
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                await step()
            except ReplagError as exc:
                log.warning("%s: %s", step.__name__, exc)
            except Exception:
                # A bug in one round must not end a service an SRE team relies on: log it
                # with its traceback and try again next round.
                self.counters["crashed rounds"] += 1
                log.exception("%s failed; retrying next round", step.__name__)
            delay = max(0.0, interval_s - (time.monotonic() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def prune_round(self) -> None:
        """Compact old windows, and keep the store (and the in-memory index) to `retention`."""
        now = time.time_ns()
        merged, written, removed = await asyncio.to_thread(
            self.store.compact,
            older_than_ns=now - int(self.settings.compact_after * 1e9),
            window_ns=max(1, int(self.settings.window * 1e9)),
        )
        if merged:
            self.index.forget_ids(removed)
            log.info("compaction: %d lag windows merged into %d", merged, written)
        cutoff = now - int(self.settings.retention * 1e9)
        deleted = await asyncio.to_thread(self.store.prune, cutoff)
        deleted["dynomite_stats"] = await asyncio.to_thread(prune_stats, self.store, cutoff)
        deleted["alert_events"] = await asyncio.to_thread(self.alert_book.prune_events, cutoff)
        deleted |= await asyncio.to_thread(replication_history.prune, self.store, cutoff)
        await asyncio.to_thread(
            replication_history.thin,
            self.store,
            older_than_ns=now - int(self.settings.compact_after * 1e9),
            window_ns=max(1, int(self.settings.window * 1e9)),
        )
        forgotten = self.index.forget_before(cutoff)
        if any(deleted.values()):
            log.info(
                "retention: pruned %s; %d windows dropped from the index",
                ", ".join(f"{n} {t}" for t, n in deleted.items() if n),
                forgotten,
            )

    # --- probing -------------------------------------------------------------

    async def probe_round(self) -> list[ProbeReport]:
        """Probe from every region with a write endpoint, one after the other, then alert."""
        reports = []
        for region in self.config.topology.regions:
            if region.write is None:
                continue
            report = await self._probe_source(region.name, region.write.name)
            if report is not None:
                reports.append(report)
        await self.evaluate_alerts()
        return reports

    async def _probe_source(self, source: str, write_name: str) -> ProbeReport | None:
        try:
            report = await self._probe(self.config, source=source, store=self.store)
        except EndpointError as exc:
            self.counters["probe errors"] += 1
            self.metrics.probe_runs.labels(source, "ok")  # the series exists, at 0
            self.metrics.probe_runs.labels(source, "error").inc()
            record_probe(
                self.store,
                source=source,
                run_id=None,
                error=str(exc),
                unreachable=[{"replica": write_name, "region": source, "error": str(exc)}],
            )
            log.warning("probe from %s failed: %s", source, exc)
            return None
        self.counters["probe runs"] += 1
        self._log_silent_replicas(report)
        if report.replication is not None:
            self._observe_replication(report.replication)
        for event in report.failovers:
            self.metrics.replication.failover(source)
            log.warning("%s", event.render())
        self.metrics.observe_probe(
            source=source,
            targets=[p.target for p in report.pairs],
            samples=report.samples,
            write=report.write,
            unreachable=len(report.unreachable),
            finished_s=time.time(),
        )
        record_probe(
            self.store,
            source=source,
            run_id=report.run_id,
            error=None,
            unreachable=list(report.unreachable),
        )
        return report

    def _log_silent_replicas(self, report: ProbeReport) -> None:
        """Log when a replica starts and stops losing every probe (reachable, not replicating)."""
        for pair in report.pairs:
            key = (report.source, pair.replica)
            silent = pair.error is None and pair.sent > 0 and pair.seen == 0
            if silent and key not in self._silent:
                self._silent.add(key)
                log.warning(
                    "%s→%s: replica %s saw none of %d probes within %gs: reachable but not "
                    "replicating",
                    report.source,
                    pair.target,
                    pair.replica,
                    pair.sent,
                    self.settings.timeout,
                )
            elif not silent and key in self._silent and pair.error is None:
                self._silent.discard(key)
                log.info(
                    "%s→%s: replica %s replicating again (%d of %d probes seen)",
                    report.source,
                    pair.target,
                    pair.replica,
                    pair.seen,
                    pair.sent,
                )

    # --- replication state ------------------------------------------------------

    def replication_targets(self) -> list[SampleTarget]:
        """Every primary to sample: a Sentinel region's where the probe last found it."""
        regions = []
        for region in self.config.topology.regions:
            if region.write is not None and region.sentinel is not None:
                known = replication_history.write_primary(self.store, region.name)
                if known is not None:
                    host, _, port = known.address.rpartition(":")
                    moved = endpoint_at(self.config.topology, region, host, int(port))
                    region = dataclasses.replace(region, write=moved)
            regions.append(region)
        return replication_targets(self.config.topology, sources=regions)[0]

    async def replication_round(self) -> None:
        """Sample every primary and its replicas, store it, export it, then alert."""
        snapshot = await self.replication_sampler.sample(self.replication_targets())
        await asyncio.to_thread(replication_history.record_snapshot, self.store, snapshot)
        self.counters["replication samples"] += 1
        for primary in snapshot.primaries:
            if primary.error:
                log.warning("replication of %s: %s", primary.source, primary.error)
        self._observe_replication(snapshot)
        await self.evaluate_alerts()

    def _observe_replication(self, snapshot: ReplicationSnapshot) -> None:
        now = time.time_ns()
        for primary in snapshot.primaries:
            self.replication_latest[(primary.source, primary.primary)] = primary
            assessment = self.failover_assessment(primary, now_ns=now)
            nan = float("nan")
            self.metrics.replication.update(
                primary,
                [
                    (
                        c.replica,
                        nan if c.rpo_bytes is None else float(c.rpo_bytes),
                        nan if c.rpo_s is None else c.rpo_s,
                    )
                    for c in assessment.candidates
                ],
            )
            if primary.error is None:
                self.metrics.last_success.labels("replication", primary.source).set(now / 1e9)

    def failover_assessment(self, primary: PrimaryState, *, now_ns: int) -> FailoverAssessment:
        """RPO of each replica of `primary`, with the probe's recent p99 lag as its time."""
        lag = recent_lag_p99_ms(
            self.store,
            primary.source,
            now_ns=now_ns,
            freshness_s=max(300.0, 3 * self.settings.probe_interval),
        )
        return assess_failover(primary, lag_p99_ms=lag)

    def latest_replication(self) -> list[PrimaryState]:
        """The latest sample of every primary: this service's, else the store's (cron's)."""
        if self.replication_latest:
            latest = list(self.replication_latest.values())
        else:
            latest = replication_history.latest_primaries(self.store)
        newest: dict[str, PrimaryState] = {}
        for p in latest:  # after a failover a source's old primary is history
            if p.source not in newest or p.sampled_ns > newest[p.source].sampled_ns:
                newest[p.source] = p
        return sorted(newest.values(), key=lambda p: p.source)

    def replication_status(self) -> dict[str, Any]:
        """What `GET /api/v1/replication` returns: each primary's latest state with its
        failover assessment, and the failovers followed in the last day."""
        now = time.time_ns()
        primaries = []
        for p in self.latest_replication():
            out = p.to_dict()
            out["sampled_ns"] = p.sampled_ns
            out["age_s"] = round((now - p.sampled_ns) / 1e9, 3)
            out["failover"] = self.failover_assessment(p, now_ns=now).to_dict()
            for replica, row in zip(p.replicas, out["replicas"], strict=True):
                bands = headroom_bands(self.config, p.source, replica.region)
                row["headroom_colour"] = bands.colour(replica.headroom_fraction)
                row["headroom_bands"] = bands.to_dict()
            primaries.append(out)
        return {
            "interval_s": self.settings.replication_interval,
            "primaries": primaries,
            "failovers": replication_history.failover_events(
                self.store, since_ns=now - 86_400 * 10**9
            ),
        }

    def recent_replication_cells(self) -> list[dict[str, Any]] | None:
        """`replication_cells` as last built, None when the caller must build them: before
        the first build, and when they are older than one `replication_interval` (a sample
        taken since could say a link went down: old cells must never be answered as the
        present). Cells older than `REPLICATION_CELLS_MAX_AGE_S` are answered once more
        while a thread rebuilds them: samples come every `replication_interval`, so a
        matrix request seldom rebuilds the cells (or reads the store, or waits for it)."""
        built = self._replication_cells
        if built is None:
            return None
        age = time.monotonic() - built[0]
        if age > self.settings.replication_interval:
            return None
        if age > REPLICATION_CELLS_MAX_AGE_S:
            if self._jobs_loop is None:
                return None  # not started: the caller rebuilds them
            self._rebuild_replication_cells_soon(self._jobs_loop)
        return built[1]

    def _rebuild_replication_cells_soon(self, jobs: BackgroundLoop) -> None:
        """Rebuild the cells off the API's loop, once however many requests find them old:
        the requests meanwhile get the previous cells, at most one rebuild late. (On the
        jobs' loop's thread pool: starting a thread from the API's loop waits for the
        thread to run, which took 75 ms on a busy host.)"""
        with self._job_lock:
            if self._replication_cells_rebuilding:
                return
            self._replication_cells_rebuilding = True

        async def rebuild() -> None:
            try:
                await asyncio.to_thread(self.replication_cells)
            finally:
                self._replication_cells_rebuilding = False

        pending = rebuild()
        try:
            jobs.submit(pending)
        except RuntimeError:  # the loop closed meanwhile (stopping): nothing to rebuild for
            pending.close()
            self._replication_cells_rebuilding = False

    def replication_cells(self) -> list[dict[str, Any]]:
        """Per (source, target region): the worst replica's bytes behind and headroom."""
        cells = self._build_replication_cells()
        self._replication_cells = (time.monotonic(), cells)
        return cells

    def _build_replication_cells(self) -> list[dict[str, Any]]:
        cells: dict[tuple[str, str], dict[str, Any]] = {}
        for p in self.latest_replication():
            for r in p.replicas:
                cell = cells.setdefault(
                    (p.source, r.region),
                    {
                        "source": p.source,
                        "target": r.region,
                        "bytes_behind": None,
                        "headroom_fraction": None,
                        "links_down": 0,
                        "replicas": 0,
                        "sampled_ns": p.sampled_ns,
                    },
                )
                cell["replicas"] += 1
                cell["links_down"] += 0 if r.link_up else 1
                if r.bytes_behind is not None:
                    cell["bytes_behind"] = max(cell["bytes_behind"] or 0, r.bytes_behind)
                if r.headroom_fraction is not None:
                    fraction = cell["headroom_fraction"]
                    cell["headroom_fraction"] = round(
                        r.headroom_fraction
                        if fraction is None
                        else min(fraction, r.headroom_fraction),
                        4,
                    )
        for cell in cells.values():
            bands = headroom_bands(self.config, cell["source"], cell["target"])
            cell["headroom_colour"] = bands.colour(cell["headroom_fraction"])
        return list(cells.values())

    async def evaluate_alerts(self) -> None:
        # Queries skip picking up new windows while the store is busy; rules must see the
        # round that just ended, so wait for it here (in a thread: the store may be busy).
        await asyncio.to_thread(self.index.refresh)
        outcome = await evaluate_and_notify(
            self.config, self.store, index=self.index, sender=self.sender
        )
        self.counters["alert notifications"] += len(outcome.events)
        self.metrics.alerts_firing.set(self.alert_book.firing_count())

    # --- Dynomite /info ---------------------------------------------------------

    async def dynomite_round(self) -> None:
        """Read every Dynomite node's /info into the store and metrics, then alert.

        A node that does not answer is logged when it starts or stops failing (not
        every round), counted in the metrics and listed by the API; the others'
        samples are kept all the same.
        """
        collection = await collect_dynomite_stats(
            self.settings.dynomite_stats_urls,
            store=self.store,
            timeout_s=self.settings.connect_timeout,
        )
        for url, error in collection.errors.items():
            if self.dynomite_errors.get(url) != error:
                log.warning("Dynomite stats from %s: %s", url, error)
        for url in self.dynomite_errors.keys() - collection.errors.keys():
            log.info("Dynomite stats from %s: answering again", url)
        self.dynomite_errors = dict(collection.errors)
        self.dynomite_collected_ns = time.time_ns()
        self.counters["dynomite samples"] += len(collection.samples)
        if collection.errors:
            self.counters["dynomite errors"] += len(collection.errors)
        self.metrics.observe_dynomite(
            samples=collection.samples, errors=collection.errors, finished_s=time.time()
        )
        await self.evaluate_alerts()

    def dynomite_status(self) -> dict[str, Any]:
        """What `GET /api/v1/dynomite` returns: each configured node's latest stored sample,
        the last collection's errors, and nodes whose dropped peer requests grew within
        the window of the first `dynomite_dropped_writes` rule (5 minutes without one)."""
        urls = self.settings.dynomite_stats_urls
        latest = [s for s in recent_stats(self.store, limit=1) if s.node in urls]
        window_s = next(
            (r.over_s for r in self.config.alerts.rules if r.kind == "dynomite_dropped_writes"),
            300.0,
        )
        since_ns = time.time_ns() - int(window_s * 1e9)
        findings = dropped_writes_since(self.store, since_ns=since_ns)
        return {
            "configured": len(urls),
            "interval_s": self.settings.probe_interval,
            "collected_ns": self.dynomite_collected_ns,
            "window_s": window_s,
            "nodes": [s.to_dict() for s in sorted(latest, key=lambda s: (s.dc, s.rack, s.node))],
            "errors": [
                {"node": url, "error": error} for url, error in self.dynomite_errors.items()
            ],
            "dropped_writes": [f.to_dict() for f in findings if f.node in urls],
            "figures": [{"name": f.name, "help": f.help, "counter": f.counter} for f in FIGURES],
        }

    def _count_delivery(self, result: DeliveryResult) -> None:
        self.metrics.alert_deliveries.labels(result.sink, "ok" if result.ok else "failed").inc()

    # --- repair checks and runs ----------------------------------------------

    async def check_round(self) -> None:
        """Check every group in turn (skipping busy ones), then evaluate the alerts."""
        for group in self.config.topology.groups:
            try:
                job = self.start_job("check", group.name)
            except JobConflict:
                continue
            except ReplagError as exc:
                log.warning("check of %s not started: %s", group.name, exc)
                continue
            await self.wait_job(job.id)
        await self.evaluate_alerts()

    def start_job(self, action: JobAction, group: str | None, **options: Any) -> RepairJob:
        """Start a check or repair in the background.

        Raises JobConflict while a job of the same group, or of every group, runs (a job
        of every group conflicts with any), and UsageError for an unknown group or a
        policy the repair library would refuse, so the caller hears of it now.
        """
        if group is not None:
            self.config.topology.group(group)  # UsageError naming the known groups
        if action == "repair":
            self._check_policy(group, options.get("policy", "quorum"))
        job = RepairJob(
            id=uuid.uuid4().hex[:12], action=action, group=group, started_ns=time.time_ns()
        )
        with self._job_lock:
            running = [g for g in self._busy if group is None or g is None or g == group]
            if running:
                what = running[0] or "every group"
                raise JobConflict(f"a check or repair of {what} is already running")
            self._busy[group] = job.id
            self.jobs[job.id] = job
            self._prune_jobs()
        coro = self._run_job(job, options)
        # On the jobs' own loop when the schedules run: a check's CPU-bound stretches then
        # hold up neither the API nor the probes' observations.
        future: concurrent.futures.Future[None] | asyncio.Future[None] = (
            self._jobs_loop.submit(coro)
            if self._jobs_loop is not None
            else asyncio.ensure_future(coro)
        )
        self._job_tasks[job.id] = future

        def finished(_: object) -> None:
            with self._job_lock:
                self._job_tasks.pop(job.id, None)
                if self._busy.get(group) == job.id:  # also when cancelled before it started
                    del self._busy[group]

        future.add_done_callback(finished)
        return job

    def _check_policy(self, group: str | None, policy: str) -> None:
        """Parse `policy` for every group the job covers, as the repair will (UsageError)."""
        groups = [self.config.topology.group(group)] if group else self.config.topology.groups
        for g in groups:
            parse_policy(policy, g.members)

    async def wait_job(self, job_id: str) -> RepairJob:
        """Wait (from any loop) for a started job to end; a cancelled wait leaves it running."""
        future = self._job_tasks.get(job_id)
        if isinstance(future, concurrent.futures.Future):
            await asyncio.shield(asyncio.wrap_future(future))
        elif future is not None:
            await asyncio.shield(future)
        return self.jobs[job_id]

    async def _run_job(self, job: RepairJob, options: dict[str, Any]) -> None:
        """Run `job` (its group is already claimed in `_busy`), then an auto-repair if due."""
        group_label = job.group or "all"
        try:
            if job.action == "check":
                report = await check(
                    self.job_config, group=job.group, store=self.store, ttls=options.get("ttls")
                )
            else:
                report = await repair(self.job_config, group=job.group, store=self.store, **options)
            job.run_id, job.divergent = report.run_id, int(report.divergent)
            job.state = "done"
            self._observe_repair(job, report)
        except ReplagError as exc:
            self._job_failed(job, str(exc))
            log.warning("%s of %s failed: %s", job.action, group_label, exc)
            return
        except Exception as exc:
            # A bug or an unexpected network error (ConnectionResetError…) must not leave
            # the job "running" forever nor stop the next group's check.
            self.counters["crashed jobs"] += 1
            self._job_failed(job, f"{type(exc).__name__}: {exc}")
            log.exception("%s of %s crashed", job.action, group_label)
            return
        finally:
            job.finished_ns = time.time_ns()
        self.counters[f"{job.action}s"] += 1
        outcome = "divergent" if job.divergent else "clean"
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
            with self._job_lock:
                self.jobs[follow.id] = follow
            await self._run_job(follow, {})

    def _job_failed(self, job: RepairJob, error: str) -> None:
        job.state, job.error = "failed", error
        self.metrics.repair_runs.labels(job.group or "all", job.action, "error").inc()
        if job.group:
            record_check(self.store, group=job.group, divergent=None, run_id=None, error=error)

    def _observe_repair(self, job: RepairJob, report: RepairReport) -> None:
        """Per-group figures of a RepairReport: divergent keys, repair outcomes, group health."""
        for group in report.groups:
            if job.action == "check" or not report.dry_run:
                self.metrics.divergent.labels(group.group).set(group.divergent)
                record_check(
                    self.store,
                    group=group.group,
                    divergent=group.divergent,
                    run_id=report.run_id,
                    error=None,
                )
            for outcome, count in group.outcomes.items():
                self.metrics.repaired_keys.labels(group.group, outcome).inc(count)

    def _prune_jobs(self, keep: int = 200) -> None:
        finished = [j for j in self.jobs.values() if j.state != "running"]
        for job in finished[: max(0, len(self.jobs) - keep)]:
            del self.jobs[job.id]

    # --- what the API shows ----------------------------------------------------

    def health(self) -> dict[str, Any]:
        """The replication verdict now (`replag.alerts.verdict`) and the service's state."""
        probes = {name: h.to_dict() for name, h in probe_health(self.store).items()}
        verdict = replication_health(
            self.config,
            self.index,
            now_ns=time.time_ns(),
            alerts_firing=self.alert_book.firing_count(),
        )
        return {
            **verdict.to_dict(),
            "started_ns": self.started_ns,
            "uptime_s": round((time.time_ns() - self.started_ns) / 1e9, 3),
            "probe_interval_s": self.settings.probe_interval,
            "check_interval_s": self.settings.check_interval,
            "auto_repair": self.settings.auto_repair,
            "probes": probes,
            "jobs_running": sum(j.state == "running" for j in self.jobs.values()),
        }
