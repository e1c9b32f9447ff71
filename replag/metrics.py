"""Prometheus metrics of one service, in a registry of its own (never the global one).

Lag is observed per probe sample into log-spaced buckets from 0.1 ms to 10 s,
`lag_buckets_per_decade` of them a decade (a setting, default 5: 30 series per
replica, the budget in docs/metrics.md); `histogram_quantile()` reads within a
bucket's width of the exact percentiles the API computes from the stored HDR windows.
Lag, sent and lost are per replica (labels source, target, replica, and rack
for a Dynomite rack, else empty): a region is a `sum by (source, target)`.
Every series of every replica the topology names exists from the start (lost
probes at 0), so a lost/sent ratio is 0, not empty, for a healthy replica. Dynomite's /info
figures are exported as they were last read, one series per node
(`replag_dynomite_*`, labels dc, rack, node), µs converted to seconds.
Replication state (`replag_replication_*`) is the latest sample of every
primary, per replica (labels source, primary, region, replica) and per primary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from replag.histogram import LagHistogram, SparseHistogram
from replag.monitoring.dynomite_figures import FIGURES, DynomiteStats, Figure
from replag.probes.targets import ObservedReplica
from replag.replication.state import PrimaryState, ReplicaState
from replag.store import Store
from replag.store.backlog import StoreHealth

# Lag: log-spaced buckets from 0.1 ms to 10 s, n a decade (each 10^(1/n) above the last).
# histogram_quantile() interpolates linearly inside a bucket, so its error is at most the
# bucket's width (5 a decade: 58 %; 48: 4.9 %). Every bucket is a series per replica:
# 5n + 2 buckets (with +Inf), _count, _sum and _created. The default, 5, is 30 series per
# replica (an estate of 1,000 replicas: 30,000); 48 was 245.
LAG_BUCKETS_PER_DECADE = 5
LAG_DECADES = 5  # 0.1 ms to 10 s


def lag_buckets_s(per_decade: int = LAG_BUCKETS_PER_DECADE) -> tuple[float, ...]:
    """The bounds of replag_lag_seconds at `per_decade` buckets a decade; 1 s is always one
    (the lag SLO's threshold is a bound)."""
    return tuple(
        float(f"{10 ** (k / per_decade - 4):.4g}") for k in range(LAG_DECADES * per_decade + 1)
    )


LAG_BUCKETS_S = lag_buckets_s()
# The labels of every lag, sent and lost series: one replica (a Dynomite rack's `rack`).
REPLICA_LABELS = ("source", "target", "replica", "rack")
# Write acknowledgements: 1-2.5-5 per decade, 0.1 ms to 1 s (an alerting aid, not a measurement).
WRITE_BUCKETS_S = (*(m * 10.0**e for e in range(-4, 0) for m in (1, 2.5, 5)), 1.0)


class DynomiteCollector(Collector):
    """The last /info sample of every node that answered, as Prometheus series.

    Dynomite's counters are exported as counters holding Dynomite's own value
    (as exporters do), so `rate()` and `increase()` handle its restarts and
    periodic resets; queue lengths and latencies are gauges.
    """

    LABELS = ("dc", "rack", "node")

    def __init__(self) -> None:
        self._samples: tuple[DynomiteStats, ...] = ()

    def update(self, samples: Sequence[DynomiteStats]) -> None:
        # A node missing from this round drops out rather than repeating stale figures.
        self._samples = tuple(samples)

    def collect(self) -> Iterator[Metric]:
        uptime = GaugeMetricFamily(
            "replag_dynomite_uptime_seconds", "Dynomite node uptime.", labels=self.LABELS
        )
        for s in self._samples:
            uptime.add_metric([s.dc, s.rack, s.node], s.uptime_s)
        yield uptime
        for figure in FIGURES:
            family = _family(figure)
            scale = 1e-6 if figure.name.endswith("_us") else 1.0
            for s in self._samples:
                value = s.figures.get(figure.name)
                if value is not None:
                    family.add_metric([s.dc, s.rack, s.node], value * scale)
            yield family


def dynomite_metric_name(figure: Figure) -> str:
    """`replag_dynomite_<figure>`, µs figures in seconds (counters gain `_total` on export)."""
    name = figure.name.removesuffix("_us") + ("_seconds" if figure.name.endswith("_us") else "")
    return f"replag_dynomite_{name}"


def _family(figure: Figure) -> CounterMetricFamily | GaugeMetricFamily:
    help_text = figure.help.replace("(µs)", "(seconds)")
    if figure.counter:
        return CounterMetricFamily(
            dynomite_metric_name(figure), help_text, labels=DynomiteCollector.LABELS
        )
    return GaugeMetricFamily(
        dynomite_metric_name(figure), help_text, labels=DynomiteCollector.LABELS
    )


class ReplicationCollector(Collector):
    """Replication state as Prometheus series, from the latest sample of each primary.

    Every (source, primary, replica) the topology names has its series from the start
    (NaN until first read, and while unknown, e.g. an unreachable replica's bytes), so
    a replica that stops answering keeps its series and `link_up` reads 0. Resync
    counters are the primary's own `sync_*` counts (counters, as exporters do), kept
    while the primary cannot be read (a drop to 0 would read as a counter reset).
    """

    REPLICA = ("source", "primary", "region", "replica")
    PRIMARY = ("source", "primary")

    def __init__(self) -> None:
        self._expected: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}
        self._latest: dict[tuple[str, str], PrimaryState] = {}
        self._rpo: dict[tuple[str, str, str], tuple[float, float]] = {}
        self._resyncs: dict[tuple[str, str], tuple[int, int, int]] = {}
        self._failovers: dict[str, int] = {}
        # Whether this process exports the replication state: under leases, only while it
        # holds the replication unit (`ReplicationSampling` sets it), so every instance
        # can be scraped and nothing is exported twice.
        self.exported = True

    def expect(self, plan: Iterable[tuple[str, str, Sequence[tuple[str, str]]]]) -> None:
        """(source, primary, [(region, replica), …]) whose series exist from now on."""
        for source, primary, replicas in plan:
            self._expected[(source, primary)] = tuple(replicas)
            self._failovers.setdefault(source, 0)

    def update(self, primary: PrimaryState, rpo: Iterable[tuple[str, float, float]]) -> None:
        """A new sample of one primary and its candidates' RPO (replica, bytes, seconds)."""
        key = (primary.source, primary.primary)
        # One primary per source: after a failover the old one's series go.
        for old in [k for k in self._expected if k[0] == primary.source and k != key]:
            self._expected.pop(old)
            self._latest.pop(old, None)
            self._resyncs.pop(old, None)
            self._rpo = {k: v for k, v in self._rpo.items() if k[:2] != old}
        self._latest[key] = primary
        if primary.sync_full is not None:
            # An unread sample keeps the last counts: a drop to 0 would read as a reset.
            self._resyncs[key] = (
                primary.sync_full,
                primary.sync_partial_ok or 0,
                primary.sync_partial_err or 0,
            )
        listed = list(self._expected.get(key, ()))
        for r in primary.replicas:
            if (r.region, r.replica) not in listed:
                listed.append((r.region, r.replica))
        self._expected[key] = tuple(listed)
        # Unknown until this sample says otherwise (an unread primary has no candidates).
        self._rpo = {k: v for k, v in self._rpo.items() if k[:2] != key}
        for replica, rpo_bytes, rpo_s in rpo:
            self._rpo[(primary.source, primary.primary, replica)] = (rpo_bytes, rpo_s)

    def failover(self, source: str) -> None:
        self._failovers[source] = self._failovers.get(source, 0) + 1

    def collect(self) -> Iterator[Metric]:
        families = _ReplicationFamilies(self.REPLICA, self.PRIMARY)
        expected = self._expected.items() if self.exported else ()
        for (source, primary), replicas in sorted(expected):
            state = self._latest.get((source, primary))
            states = {r.replica: r for r in state.replicas} if state else {}
            for region, replica in replicas:
                loss = self._rpo.get((source, primary, replica), (_NAN, _NAN))
                families.add_replica([source, primary, region, replica], states.get(replica), loss)
            resyncs = self._resyncs.get((source, primary), (0, 0, 0))
            families.add_primary([source, primary], state, resyncs)
        for source, count in sorted(self._failovers.items()):
            families.failovers.add_metric([source], float(count))
        yield from families.all()


_NAN = float("nan")


def _value(x: float | None) -> float:
    """A gauge's value: NaN while unknown."""
    return _NAN if x is None else float(x)


class _ReplicationFamilies:
    """The replication metric families of one scrape (per replica, per primary, counters)."""

    def __init__(self, replica: Sequence[str], primary: Sequence[str]) -> None:
        def gauge(name: str, text: str, labels: Sequence[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=labels)

        self.behind = gauge(
            "replag_replication_offset_lag_bytes",
            "Primary's replication offset minus the replica's applied offset (midpoint).",
            replica,
        )
        self.uncertainty = gauge(
            "replag_replication_offset_lag_uncertainty_bytes",
            "Half the bytes the primary wrote while the offsets were read (± on lag bytes).",
            replica,
        )
        self.link = gauge(
            "replag_replication_link_up",
            "1 when the replica's link to its primary is up and it is not resyncing.",
            replica,
        )
        self.headroom = gauge(
            "replag_replication_backlog_headroom_bytes",
            "Bytes the primary may still write before a reconnect of this replica means a "
            "full resync (negative: already gone from the backlog).",
            replica,
        )
        self.ratio = gauge(
            "replag_replication_backlog_headroom_ratio",
            "Backlog headroom over repl-backlog-size (1 caught up, 0 full resync due).",
            replica,
        )
        self.rpo_bytes = gauge(
            "replag_replication_rpo_bytes",
            "Bytes a failover to this replica would lose now.",
            replica,
        )
        self.rpo_seconds = gauge(
            "replag_replication_rpo_seconds",
            "Writes (in time) a failover to this replica would lose now.",
            replica,
        )
        self.rate = gauge(
            "replag_replication_write_rate_bytes_per_second",
            "Growth of the primary's replication offset between samples.",
            primary,
        )
        self.skew = gauge(
            "replag_replication_read_skew_seconds",
            "How long reading the primary, its replicas and the primary again took.",
            primary,
        )
        self.backlog = gauge(
            "replag_replication_backlog_size_bytes",
            "The primary's repl-backlog-size.",
            primary,
        )
        self.resyncs = CounterMetricFamily(
            "replag_replication_resyncs",
            "Resyncs the primary served: full, partial_ok, partial_err (INFO stats sync_*).",
            labels=(*primary, "kind"),
        )
        self.failovers = CounterMetricFamily(
            "replag_replication_failovers",
            "Sentinel failovers the probe followed, per source region.",
            labels=("source",),
        )

    def add_replica(
        self, labels: list[str], r: ReplicaState | None, loss: tuple[float, float]
    ) -> None:
        """One replica's sample (None: not read, its gauges NaN and its link 0)."""
        self.behind.add_metric(labels, _value(r.bytes_behind if r else None))
        self.uncertainty.add_metric(labels, _value(r.bytes_uncertainty if r else None))
        self.link.add_metric(labels, 1.0 if r is not None and r.link_up else 0.0)
        self.headroom.add_metric(labels, _value(r.backlog_headroom if r else None))
        self.ratio.add_metric(labels, _value(r.headroom_fraction if r else None))
        self.rpo_bytes.add_metric(labels, loss[0])
        self.rpo_seconds.add_metric(labels, loss[1])

    def add_primary(
        self, labels: list[str], state: PrimaryState | None, resyncs: tuple[int, int, int]
    ) -> None:
        """One primary's sample (rate and skew NaN while it is unknown or in error) and its
        last known resync counts."""
        ok = state is not None and state.error is None
        self.rate.add_metric(labels, _value(state.write_rate_bps if ok and state else None))
        self.skew.add_metric(labels, state.read_skew_ns / 1e9 if ok and state else _NAN)
        self.backlog.add_metric(labels, _value(state.backlog_size if state else None))
        for kind, count in zip(("full", "partial_ok", "partial_err"), resyncs, strict=True):
            self.resyncs.add_metric([*labels, kind], float(count))

    def all(self) -> tuple[Metric, ...]:
        """In the order they are exported."""
        return (
            *(self.behind, self.uncertainty, self.link, self.headroom, self.ratio),
            *(self.rpo_bytes, self.rpo_seconds, self.rate, self.skew, self.backlog),
            *(self.resyncs, self.failovers),
        )


class ServiceMetrics:
    def __init__(self, *, lag_buckets_per_decade: int = LAG_BUCKETS_PER_DECADE) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # (source, target, replica) → its rack label ("" when not a Dynomite rack).
        self._racks: dict[tuple[str, str, str], str] = {}
        # Called with (labels, seconds) for every lag observed (the OTLP export's histogram).
        self.lag_listeners: list[Callable[[Sequence[str], float], None]] = []
        r = self.registry
        self.store = StoreCollector()
        r.register(self.store)
        self.lag = Histogram(
            "replag_lag_seconds",
            "Replication lag of probe writes, source region to one replica of the target.",
            REPLICA_LABELS,
            buckets=lag_buckets_s(lag_buckets_per_decade),
            registry=r,
        )
        self.probes_sent = Counter(
            "replag_probes_sent",
            "Probe writes expected on the replica.",
            REPLICA_LABELS,
            registry=r,
        )
        self.probes_lost = Counter(
            "replag_probes_lost",
            "Probe writes not seen on the replica before the timeout.",
            REPLICA_LABELS,
            registry=r,
        )
        self.write_latency = Histogram(
            "replag_write_latency_seconds",
            "Acknowledgement latency of probe writes.",
            ["source"],
            buckets=WRITE_BUCKETS_S,
            registry=r,
        )
        self.unreachable = Gauge(
            "replag_unreachable_replicas",
            "Replicas the last probe round could not reach.",
            ["source"],
            registry=r,
        )
        self.probe_runs = Counter(
            "replag_probe_runs",
            "Probe runs by outcome.",
            ["source", "outcome"],
            registry=r,
        )
        self.divergent = Gauge(
            "replag_divergent_keys",
            "Keys that differ between the members of a replica group.",
            ["group"],
            registry=r,
        )
        self.not_compared = Gauge(
            "replag_not_compared_keys",
            "Keys of a replica group whose values could not be compared at the last check "
            "(a type replag cannot read whole, such as a module's): the group is not known "
            "to be clean.",
            ["group"],
            registry=r,
        )
        # Per group and replica, never per slot: 16,384 series a replica would be a
        # cardinality bomb; the check's report names the slots.
        self.slot_count_slots = Gauge(
            "replag_slot_count_differing_slots",
            "Redis Cluster (Valkey 8+, Redis 8.2+): slots whose key count on this replica "
            "differed from its primary's at the last check (CLUSTER SLOT-STATS; equal "
            "counts do not prove equal content).",
            ["group", "replica"],
            registry=r,
        )
        self.slot_count_keys = Gauge(
            "replag_slot_count_key_difference",
            "Redis Cluster (Valkey 8+, Redis 8.2+): the sum over slots of the key-count "
            "difference's size between this replica and its primary at the last check.",
            ["group", "replica"],
            registry=r,
        )
        self.repair_runs = Counter(
            "replag_repair_runs",
            "Repair checks and runs by outcome.",
            ["group", "action", "outcome"],
            registry=r,
        )
        self.repaired_keys = Counter(
            "replag_repair_keys",
            "Divergent keys handled by repair runs, by outcome (repaired, conflict, …).",
            ["group", "outcome"],
            registry=r,
        )
        self.last_success = Gauge(
            "replag_last_success_timestamp_seconds",
            "Unix time of the last successful probe, check or repair.",
            ["task", "name"],
            registry=r,
        )
        self.alerts_firing = Gauge("replag_alerts_firing", "Alerts currently firing.", registry=r)
        self.alert_deliveries = Counter(
            "replag_alert_deliveries",
            "Alert notifications by sink and outcome.",
            ["sink", "outcome"],
            registry=r,
        )
        self.dynomite = DynomiteCollector()
        r.register(self.dynomite)
        self.replication = ReplicationCollector()
        r.register(self.replication)
        self.dynomite_errors = Counter(
            "replag_dynomite_stats_errors",
            "Dynomite /info requests that failed (unreachable, bad answer), per stats URL.",
            ["node"],
            registry=r,
        )

    def watch_store(self, store: Store) -> None:
        """Export `store`'s write health, read at each scrape (see `StoreCollector`)."""
        self.store.store = store

    def expect_replicas(self, replicas: Iterable[ObservedReplica]) -> None:
        """Create every lag, sent and lost series of `replicas` (at 0) now, before any probe."""
        for o in replicas:
            self._create_series(o.source, o.target, o.replica, o.rack)
            for outcome in ("ok", "error"):
                self.probe_runs.labels(o.source, outcome)

    def _create_series(self, source: str, target: str, replica: str, rack: str | None) -> None:
        labels = (source, target, replica, rack or "")
        self.probes_sent.labels(*labels)
        self.probes_lost.labels(*labels)
        self.lag.labels(*labels)
        self._racks[(source, target, replica)] = rack or ""

    def observe_probe(
        self,
        *,
        source: str,
        replicas: Iterable[tuple[str, str, str | None]] = (),
        samples: Iterable[Any],
        write: LagHistogram,
        unreachable: int,
        finished_s: float,
    ) -> None:
        """Record one finished probe run (samples: ProbeSample-like objects).

        `replicas`: (target, replica, rack) of every replica the run observed; each one's
        series are created (at 0) even without a sample or a loss.
        """
        samples = list(samples)
        for target, replica, rack in replicas:
            self._create_series(source, target, replica, rack)
        for outcome in ("ok", "error"):
            self.probe_runs.labels(source, outcome)
        for sample in samples:
            labels = self._labels(source, sample.target, sample.replica)
            self.probes_sent.labels(*labels).inc()
            if sample.lag_ns is None:
                self.probes_lost.labels(*labels).inc()
            else:
                seconds = max(sample.lag_ns, 0) / 1e9
                self.lag.labels(*labels).observe(seconds)
                for listener in self.lag_listeners:
                    listener(labels, seconds)
        for value_us, count in SparseHistogram.from_lag_histogram(write).values_us():
            for _ in range(count):
                self.write_latency.labels(source).observe(value_us / 1e6)
        self.unreachable.labels(source).set(unreachable)
        self.probe_runs.labels(source, "ok").inc()
        self.last_success.labels("probe", source).set(finished_s)

    def forget_probe_gauges(self, source: str) -> None:
        """Stop exporting `source`'s probe gauges (another instance probes from it now);
        its counters stay: they count what this process did."""
        for gauge, labels in (
            (self.unreachable, (source,)),
            (self.last_success, ("probe", source)),
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)

    def forget_task_gauges(self, task: str, names: Iterable[str]) -> None:
        """Stop exporting `task`'s last-success gauges of `names` (another instance runs it
        now)."""
        for name in names:
            with contextlib.suppress(KeyError):
                self.last_success.remove(task, name)

    def _labels(self, source: str, target: str, replica: str) -> tuple[str, str, str, str]:
        rack = self._racks.get((source, target, replica))
        if rack is None:
            self._create_series(source, target, replica, None)
            rack = ""
        return source, target, replica, rack

    def observe_dynomite(
        self, *, samples: Sequence[DynomiteStats], errors: Iterable[str], finished_s: float
    ) -> None:
        """Record one collection of Dynomite /info: figures, failed nodes, last success."""
        self.dynomite.update(samples)
        for node in errors:
            self.dynomite_errors.labels(node).inc()
        for sample in samples:
            self.last_success.labels("dynomite_stats", sample.node).set(finished_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StoreCollector(Collector):
    """Whether the results store takes writes, and what waits in memory when it does not."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        health = self.store.health if self.store is not None else StoreHealth()
        writable = GaugeMetricFamily(
            "replag_store_writable",
            "1 while the results store takes writes, 0 while they are kept in memory "
            "(full disk, read-only file, database away).",
        )
        writable.add_metric([], 1.0 if health.state == "ok" else 0.0)
        yield writable
        errors = CounterMetricFamily(
            "replag_store_write_errors",
            "Writes the results store refused (each then kept in memory and retried).",
        )
        errors.add_metric([], float(health.errors))
        yield errors
        deferred = GaugeMetricFamily(
            "replag_store_deferred_writes",
            "Statements held (in memory, or spilled to a local file) until the results store "
            "takes writes again.",
        )
        deferred.add_metric([], float(health.deferred))
        yield deferred
        spilled = GaugeMetricFamily(
            "replag_store_spilled_writes",
            "Of the held statements, those spilled to a local file past store_hold_memory_mb.",
        )
        spilled.add_metric([], float(health.spilled))
        yield spilled
        reachable = GaugeMetricFamily(
            "replag_store_reachable",
            "0 while the results store cannot be reached at all (PostgreSQL stopped or cut "
            "off): watching goes on from memory.",
        )
        reachable.add_metric([], 1.0 if health.reachable else 0.0)
        yield reachable
        dropped = CounterMetricFamily(
            "replag_store_dropped_writes",
            "Held statements given up on: past store_hold_memory_mb and store_hold_disk_mb, "
            "or refused by the store when written back.",
        )
        dropped.add_metric([], float(health.dropped))
        yield dropped
