"""Prometheus metrics of one service, in a registry of its own (never the global one).

Lag is observed per probe sample, so `histogram_quantile()` over
`replag_lag_seconds` gives the same shape as the stored HDR windows, at the
coarser resolution of the buckets below (0.1 ms to 10 s).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from replag.lagindex import SparseHistogram
from replag.probes.histogram import LagHistogram

LAG_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
WRITE_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
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

    def observe_probe(
        self,
        *,
        source: str,
        samples: Iterable[Any],
        write: LagHistogram,
        unreachable: int,
        finished_s: float,
    ) -> None:
        """Record one finished probe run (samples: ProbeSample-like objects)."""
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

    def render(self) -> bytes:
        return generate_latest(self.registry)
