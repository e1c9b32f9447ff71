"""Replication state in the service: the sampling unit and the view the API reads.

`ReplicationState` keeps the latest sample of each (source, primary), from the
probe runs and from `ReplicationSampling` (every primary's and replica's INFO
replication, every `replication_interval`), exports it as metrics, and
builds what `/api/v1/replication` and the matrix's replication cells show.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from replag.alerts.thresholds import headroom_bands
from replag.background import BackgroundLoop
from replag.config import Config
from replag.errors import OutsideReach, StoreUnwritable
from replag.metrics import ServiceMetrics
from replag.replication import history as replication_history
from replag.replication.check import recent_lag_p99_ms
from replag.replication.check_verdicts import CheckVerdict, VerdictCache
from replag.replication.follow import endpoint_at
from replag.replication.rpo import FailoverAssessment, assess_failover
from replag.replication.sampler import ReplicationSampler, SampleTarget, replication_targets
from replag.replication.state import PrimaryState, ReplicationSnapshot
from replag.service.leasing import Fence, LeaseKeeper
from replag.service.scheduler import Claim
from replag.store import Store

log = logging.getLogger("replag.service")
REPLICATION_CELLS_MAX_AGE_S = 0.5
# Cells older than this many replication intervals are not answered (the sampling stalled,
# or nothing asked for them for long): the caller rebuilds them. Younger ones are, while a
# thread rebuilds them: each cell carries when its primary was sampled.
REPLICATION_CELLS_STALE_INTERVALS = 3


class ReplicationState:
    """The latest replication sample of every primary, its metrics and its API views."""

    def __init__(self, config: Config, *, store: Store, metrics: ServiceMetrics) -> None:
        self.config = config
        self.settings = config.settings
        self.store = store
        self.metrics = metrics
        self.latest: dict[tuple[str, str], PrimaryState] = {}
        # The matrix's replication cells, with the monotonic moment they were built; rebuilt
        # on `rebuild_on` (the jobs' loop while the service runs).
        self._cells: tuple[float, list[dict[str, Any]]] | None = None
        self._cells_rebuilding = False
        self._lock = threading.Lock()
        self.rebuild_on: BackgroundLoop | None = None
        self.keeper: LeaseKeeper | None = None  # set while several instances may run
        self.verdicts = VerdictCache()  # the latest runs, shared with RoundFindings
        self.metrics.replication.expect(
            (t.source, t.primary.name, [(region, ep.name) for region, ep in t.replicas])
            for t in self.targets()
        )

    def targets(self) -> list[SampleTarget]:
        """Every primary to sample: a Sentinel region's or a Redis Cluster shard's where the
        probe last found it."""
        regions = []
        for region in self.config.topology.regions:
            if region.write is not None and (region.sentinel is not None or region.slots):
                try:
                    known = replication_history.write_primary(self.store, region.name)
                except StoreUnwritable:
                    known = None  # the store is away: as configured until it is back
                if known is not None:
                    host, _, port = known.address.rpartition(":")
                    try:
                        moved = endpoint_at(self.config.topology, region, host, int(port))
                    except OutsideReach:
                        regions.append(region)  # as configured: the probe reports the refusal
                        continue
                    # The configured primary, demoted (or dead), is one of the set's servers
                    # like the others: sampled as a replica, its link down while it is.
                    replicas = region.replicas
                    if not any(r.address == region.write.address for r in replicas):
                        replicas = (*replicas, region.write)
                    region = dataclasses.replace(region, write=moved, replicas=replicas)
            regions.append(region)
        return replication_targets(self.config.topology, sources=regions)[0]

    def observe(self, snapshot: ReplicationSnapshot) -> None:
        now = time.time_ns()
        # The replication gauges are the sampling unit's owner's (a probe round's snapshot
        # on another instance feeds its own view only, not its /metrics).
        owner = self.keeper is None or self.keeper.holds(ReplicationSampling.name)
        for primary in snapshot.primaries:
            self.latest[(primary.source, primary.primary)] = primary
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
            if primary.error is None and owner:
                self.metrics.last_success.labels("replication", primary.source).set(now / 1e9)

    def failover_assessment(self, primary: PrimaryState, *, now_ns: int) -> FailoverAssessment:
        """RPO of each replica of `primary`, with the probe's recent p99 lag as its time."""
        try:
            lag = recent_lag_p99_ms(
                self.store,
                primary.source,
                now_ns=now_ns,
                freshness_s=max(300.0, 3 * self.settings.probe_interval),
            )
        except StoreUnwritable:
            lag = {}  # the store is away: the RPO in seconds is unknown meanwhile
        return assess_failover(
            primary, lag_p99_ms=lag, verdicts=self.check_verdicts(), now_ns=now_ns
        )

    def check_verdicts(self) -> dict[str, CheckVerdict]:
        """Each replica's latest check or repair run (whoever ran it), from the store."""
        try:
            return self.verdicts.get(self.store)
        except StoreUnwritable:
            return {}

    def group_verdicts(self) -> dict[str, CheckVerdict]:
        """Each group's latest check or repair run (whoever ran it), from the store."""
        try:
            return self.verdicts.groups(self.store)
        except StoreUnwritable:
            return {}

    def latest_primaries(self) -> list[PrimaryState]:
        """The latest sample of every primary: this service's while it samples them, else
        the store's (another instance's, or cron's)."""
        if self.latest and (self.keeper is None or self.keeper.holds(ReplicationSampling.name)):
            latest = list(self.latest.values())
        else:
            try:
                latest = replication_history.latest_primaries(self.store)
            except StoreUnwritable:
                # The store is away: what this instance's own probe rounds saw.
                latest = list(self.latest.values())
        newest: dict[str, PrimaryState] = {}
        for p in latest:  # after a failover a source's old primary is history
            if p.source not in newest or p.sampled_ns > newest[p.source].sampled_ns:
                newest[p.source] = p
        return sorted(newest.values(), key=lambda p: p.source)

    def status(self) -> dict[str, Any]:
        """What `GET /api/v1/replication` returns: each primary's latest state with its
        failover assessment, and the failovers followed in the last day."""
        now = time.time_ns()
        primaries = []
        for p in self.latest_primaries():
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
            "failovers": self._failovers(since_ns=now - 86_400 * 10**9),
        }

    def _failovers(self, *, since_ns: int) -> list[dict[str, Any]]:
        try:
            return replication_history.failover_events(self.store, since_ns=since_ns)
        except StoreUnwritable:
            return []  # the store is away: its history answers again when it is back

    def recent_cells(self) -> list[dict[str, Any]] | None:
        """`cells` as last built, None when the caller must build them: before the first
        build, and when they are older than `REPLICATION_CELLS_STALE_INTERVALS` sampling
        intervals (a sample taken since could say a link went down: old cells must never
        be answered as the present). Cells older than `REPLICATION_CELLS_MAX_AGE_S` are
        answered once more while a thread rebuilds them, and the sampling rebuilds them
        after each sample, so a matrix request seldom waits for them (a store read, under
        100 primaries and their writes, took seconds on a busy host)."""
        built = self._cells
        if built is None:
            return None
        age = time.monotonic() - built[0]
        if age > REPLICATION_CELLS_MAX_AGE_S:
            if self.rebuild_on is None:
                return None  # not started: the caller rebuilds them
            self._rebuild_cells_soon(self.rebuild_on)
        if age > REPLICATION_CELLS_STALE_INTERVALS * self.settings.replication_interval:
            return None
        return built[1]

    def _rebuild_cells_soon(self, background: BackgroundLoop) -> None:
        """Rebuild the cells off the API's loop, once however many requests find them old:
        the requests meanwhile get the previous cells, at most one rebuild late. (On the
        jobs' loop's thread pool: starting a thread from the API's loop waits for the
        thread to run, which took 75 ms on a busy host.)"""
        with self._lock:
            if self._cells_rebuilding:
                return
            self._cells_rebuilding = True

        async def rebuild() -> None:
            try:
                await asyncio.to_thread(self.cells)
            finally:
                self._cells_rebuilding = False

        pending = rebuild()
        try:
            background.submit(pending)
        except RuntimeError:  # the loop closed meanwhile (stopping): nothing to rebuild for
            pending.close()
            self._cells_rebuilding = False

    def cells(self) -> list[dict[str, Any]]:
        """Per (source, target region): the worst replica's bytes behind and headroom."""
        cells = self._build_cells()
        self._cells = (time.monotonic(), cells)
        return cells

    def _build_cells(self) -> list[dict[str, Any]]:
        cells: dict[tuple[str, str], dict[str, Any]] = {}
        for p in self.latest_primaries():
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


class ReplicationSampling:
    """Samples every primary and its replicas, stores and exports it, then alerts."""

    name = "replication"
    claim: Claim = "lease"

    def __init__(
        self,
        state: ReplicationState,
        *,
        counters: Counter[str],
        evaluate_alerts: Callable[[], Awaitable[None]],
    ) -> None:
        self.state = state
        self.counters = counters
        self.evaluate_alerts = evaluate_alerts
        self.interval_s = state.settings.replication_interval
        self.sampler = ReplicationSampler(timeout_s=state.settings.connect_timeout)

    async def run(self, fence: Fence | None = None) -> None:
        snapshot = await self.sampler.sample(self.state.targets())
        if fence is not None:
            await asyncio.to_thread(fence.confirm)  # a paused instance stores nothing
        await asyncio.to_thread(replication_history.record_snapshot, self.state.store, snapshot)
        self.counters["replication samples"] += 1
        for primary in snapshot.primaries:
            if primary.error:
                log.warning("replication of %s: %s", primary.source, primary.error)
        self.state.observe(snapshot)
        self.state.metrics.replication.exported = True
        await asyncio.to_thread(self.state.cells)  # the matrix's, current
        await self.evaluate_alerts()

    def disown(self) -> None:
        """Another instance samples now: the replication series are exported there."""
        self.state.metrics.replication.exported = False
        sources = {r.name for r in self.state.config.topology.regions}
        self.state.metrics.forget_task_gauges(
            "replication", sources | {s for s, _ in self.state.latest}
        )

    async def close(self) -> None:
        await self.sampler.close()
