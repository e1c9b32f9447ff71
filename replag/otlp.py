"""OTLP export of `replag serve`'s metrics and of the traces of its checks and repairs.

Optional: the `otel` extra (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http),
on when the `otlp_endpoint` setting names an OTLP/HTTP endpoint (a Collector's
http://HOST:4318). Metrics: the lag of every probe sample as an exponential histogram
(`replag.lag`, unit s: OTLP's native histogram, one series per replica at any
resolution), and every other family of the service's Prometheus registry mirrored
as it is read at each export (counters as cumulative sums, gauges as gauges; the write
latency histogram stays Prometheus'). The resource carries the semantic conventions'
service.name, service.version and service.instance.id. Spans: `replag.tracing`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from replag.errors import ConfigError
from replag.metrics import REPLICA_LABELS, ServiceMetrics

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)
INSTALL = "pip install 'replag[otel]'"
# Families whose samples are histograms: not mirrored (an observable instrument cannot
# carry buckets); the lag is recorded as it is observed instead.
SKIPPED_TYPES = ("histogram", "summary")


def _unit(name: str) -> str:
    """The UCUM unit the OTLP semantic conventions use, from the Prometheus name's suffix."""
    for suffix, unit in (("_seconds", "s"), ("_bytes", "By"), ("_ratio", "1")):
        if name.endswith(suffix) or f"{suffix}_" in name:
            return unit
    return "1"


class _RegistryMirror:
    """Reads the Prometheus registry once per export, for every observable callback."""

    def __init__(self, metrics: ServiceMetrics, max_age_s: float = 1.0) -> None:
        self.metrics = metrics
        self.max_age_s = max_age_s
        self._read_at = -1e9
        self._families: dict[str, list[tuple[dict[str, str], float]]] = {}

    def families(self) -> dict[str, str]:
        """Name → type of every family mirrored (read once, at start)."""
        return {
            f.name: f.type
            for f in self.metrics.registry.collect()
            if f.type not in SKIPPED_TYPES and f.name != "replag_lag_seconds"
        }

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        now = time.monotonic()
        if now - self._read_at > self.max_age_s:
            self._families = {}
            for family in self.metrics.registry.collect():
                rows = self._families.setdefault(family.name, [])
                for s in family.samples:
                    if s.name.endswith("_created"):
                        continue
                    rows.append((dict(s.labels), float(s.value)))
            self._read_at = now
        return self._families.get(name, [])


class OtlpExport:
    """The meter and tracer providers exporting to one OTLP/HTTP endpoint."""

    def __init__(
        self,
        metrics: ServiceMetrics,
        *,
        endpoint: str,
        interval_s: float,
        instance: str | None = None,
    ) -> None:
        try:
            from opentelemetry import trace
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise ConfigError(
                f"otlp_endpoint is set but OpenTelemetry is not installed ({INSTALL}): {exc}"
            ) from None
        base = endpoint.rstrip("/")
        resource = Resource.create(
            {
                "service.name": "replag",
                "service.version": version("replag"),
                "service.instance.id": instance or f"{socket.gethostname()}-{os.getpid()}",
            }
        )
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics"),
            export_interval_millis=interval_s * 1000,
        )
        self.meters: MeterProvider = MeterProvider(
            resource=resource,
            metric_readers=[reader],
            views=[
                View(
                    instrument_name="replag.lag",
                    aggregation=ExponentialBucketHistogramAggregation(max_size=160),
                )
            ],
        )
        meter = self.meters.get_meter("replag", version("replag"))
        lag = meter.create_histogram(
            "replag.lag",
            unit="s",
            description="Replication lag of probe writes, source region to one replica.",
        )

        def record(labels: Sequence[str], seconds: float) -> None:
            lag.record(seconds, dict(zip(REPLICA_LABELS, labels, strict=True)))

        metrics.lag_listeners.append(record)
        mirror = _RegistryMirror(metrics)
        for name, kind in mirror.families().items():
            make = (
                meter.create_observable_counter
                if kind == "counter"
                else meter.create_observable_gauge
            )
            make(name, callbacks=[_callback(mirror, name)], unit=_unit(name))
        self.tracers: TracerProvider = TracerProvider(resource=resource)
        self.tracers.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces"))
        )
        # The API's global provider: replag.tracing's spans go to it (a no-op until set).
        trace.set_tracer_provider(self.tracers)
        self._record = record
        self._metrics = metrics
        log.info("exporting metrics and traces to %s every %gs", base, interval_s)

    def shutdown(self) -> None:
        """Export what is pending, then stop (the service's stop)."""
        if self._record in self._metrics.lag_listeners:
            self._metrics.lag_listeners.remove(self._record)
        self.tracers.shutdown()
        self.meters.shutdown()


def _callback(
    mirror: _RegistryMirror, name: str
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    from opentelemetry.metrics import Observation

    def observe(_: Any) -> Iterable[Observation]:
        # NaN is what replag exports for a figure not read yet: not an observation.
        return [Observation(v, labels) for labels, v in mirror.samples(name) if v == v]

    return observe
