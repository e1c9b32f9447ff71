"""Prometheus metrics of one service, in a registry of its own (never the global one).

Lag is observed per probe sample into buckets 4.9 % apart (48 per decade, 0.1 ms
to 10 s), so `histogram_quantile()` over `replag_lag_seconds` reads within
5 % of the exact percentiles the API computes from the stored HDR windows.
Every series of a pair exists from its first probe on (lost probes at 0), so a
lost/sent ratio is 0, not empty, for a healthy pair. Dynomite's /info
figures are exported as they were last read, one series per node
(`replag_dynomite_*`, labels dc, rack, node), µs converted to seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from replag.histogram import LagHistogram
from replag.lagindex import SparseHistogram
from replag.monitoring.dynomite_figures import FIGURES, DynomiteStats, Figure

# Lag: 48 buckets per decade from 0.1 ms to 10 s (241 bounds, each 4.9 % above the last).
# histogram_quantile() interpolates linearly inside a bucket, so its error is at most the
# bucket's width: 1-2.5-5 buckets read 79 ms for a p99 of 57 ms. The cost is ~240 series
# per (source, target) pair, which a Prometheus server holds easily for a fleet's regions.
LAG_BUCKETS_PER_DECADE = 48
LAG_BUCKETS_S = tuple(
    float(f"{10 ** (k / LAG_BUCKETS_PER_DECADE - 4):.4g}")
    for k in range(5 * LAG_BUCKETS_PER_DECADE + 1)
)
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


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.lag = Histogram(
            "replag_lag_seconds",
            "Replication lag of probe writes, source to target region.",
            ["source", "target"],
            buckets=LAG_BUCKETS_S,
            registry=r,
        )
        self.probes_sent = Counter(
            "replag_probes_sent",
            "Probe writes expected on each target region's replicas.",
            ["source", "target"],
            registry=r,
        )
        self.probes_lost = Counter(
            "replag_probes_lost",
            "Probe writes not seen on a replica before the timeout.",
            ["source", "target"],
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
        self.dynomite_errors = Counter(
            "replag_dynomite_stats_errors",
            "Dynomite /info requests that failed (unreachable, bad answer), per stats URL.",
            ["node"],
            registry=r,
        )

    def observe_probe(
        self,
        *,
        source: str,
        targets: Iterable[str] = (),
        samples: Iterable[Any],
        write: LagHistogram,
        unreachable: int,
        finished_s: float,
    ) -> None:
        """Record one finished probe run (samples: ProbeSample-like objects).

        Every series of each probed target is created (at 0) even without a sample or a
        loss, so rates and ratios over them exist from the first probe on.
        """
        samples = list(samples)
        for target in {*targets, *(s.target for s in samples)}:
            self.probes_sent.labels(source, target)
            self.probes_lost.labels(source, target)
            self.lag.labels(source, target)
        for outcome in ("ok", "error"):
            self.probe_runs.labels(source, outcome)
        for sample in samples:
            self.probes_sent.labels(source, sample.target).inc()
            if sample.lag_ns is None:
                self.probes_lost.labels(source, sample.target).inc()
            else:
                self.lag.labels(source, sample.target).observe(max(sample.lag_ns, 0) / 1e9)
        for value_us, count in SparseHistogram.from_lag_histogram(write).values_us():
            for _ in range(count):
                self.write_latency.labels(source).observe(value_us / 1e6)
        self.unreachable.labels(source).set(unreachable)
        self.probe_runs.labels(source, "ok").inc()
        self.last_success.labels("probe", source).set(finished_s)

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
