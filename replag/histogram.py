"""HdrHistograms of lag in integer microseconds, and the summary figures we report.

Values beyond the trackable range are clamped to it and counted in
`LagHistogram.out_of_range`, and values below zero (a lag estimate can read
slightly negative, inside its uncertainty) are recorded as 0 and counted in
`LagHistogram.negative`: nothing is dropped or clamped silently.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # one hour
SIGNIFICANT_FIGURES = 3


class LagHistogram:
    """An HdrHistogram of microseconds plus an out-of-range counter."""

    def __init__(self) -> None:
        self.hdr = HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES)
        self.out_of_range = 0
        self.negative = 0  # values below zero, recorded as 0

    def record_us(self, value_us: float) -> None:
        value = round(value_us)
        if value < 0:
            self.negative += 1
            value = 0
        elif value < LOWEST_US:
            # Sub-microsecond lag (same-host replicas): recorded as 0 µs, which HDR tracks.
            value = 0
        if value > HIGHEST_US:
            self.out_of_range += 1
            value = HIGHEST_US
        if not self.hdr.record_value(value):
            self.out_of_range += 1

    def record_ns(self, value_ns: int) -> None:
        self.record_us(value_ns / 1000)

    @property
    def count(self) -> int:
        return int(self.hdr.get_total_count())

    def merge(self, other: LagHistogram) -> None:
        self.hdr.add(other.hdr)
        self.out_of_range += other.out_of_range
        self.negative += other.negative

    def encode(self) -> bytes:
        """Compressed HDR payload (base64 text as bytes) for the store."""
        return bytes(self.hdr.encode())

    @classmethod
    def decode(cls, payload: bytes, out_of_range: int = 0) -> LagHistogram:
        hist = cls()
        if payload:
            hist.hdr.decode_and_add(payload)
        hist.out_of_range = out_of_range
        return hist

    def percentile_ms(self, pct: float) -> float | None:
        if self.count == 0:
            return None
        return float(self.hdr.get_value_at_percentile(pct)) / 1000

    def summary_ms(self) -> dict[str, float | None]:
        """mean, p50, p90, p99, p999, max in milliseconds (None when empty)."""
        if self.count == 0:
            return dict.fromkeys(("mean", "p50", "p90", "p99", "p999", "max"))
        return {
            "mean": round(float(self.hdr.get_mean_value()) / 1000, 4),
            "p50": self.percentile_ms(50),
            "p90": self.percentile_ms(90),
            "p99": self.percentile_ms(99),
            "p999": self.percentile_ms(99.9),
            "max": float(self.hdr.get_max_value()) / 1000,
        }

    def to_b64(self) -> str:
        return base64.b64encode(self.encode()).decode("ascii")


@dataclass(frozen=True, kw_only=True)
class LagSummary:
    """What the API and the CLI print for one (source, target[, replica]) over some range."""

    source: str
    target: str
    replica: str | None
    sent: int
    seen: int
    lost: int
    lag_ms: dict[str, float | None]
    uncertainty_ms: dict[str, float | None]
    out_of_range: int = 0

    @property
    def loss_ratio(self) -> float:
        return self.lost / self.sent if self.sent else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "replica": self.replica,
            "sent": self.sent,
            "seen": self.seen,
            "lost": self.lost,
            "loss_ratio": round(self.loss_ratio, 6),
            "lag_ms": self.lag_ms,
            "uncertainty_ms": self.uncertainty_ms,
            "out_of_range": self.out_of_range,
        }
