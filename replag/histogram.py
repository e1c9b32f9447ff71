"""HdrHistograms of lag in integer microseconds, and the summary figures we report.

Values beyond the trackable range are clamped to it and counted in
`LagHistogram.out_of_range`, and values below zero (a lag estimate can read
slightly negative, inside its uncertainty) are recorded as 0 and counted in
`LagHistogram.negative`: nothing is dropped or clamped silently.

hdrh's HdrHistogram and its encoder refer to each other, so each one (with its
188 KB counts array) was freed only by a pass of the cyclic garbage collector,
never when dropped: with 100 groups the probe rounds' histograms piled up between
passes (peak RSS 411–690 MB). `_acyclic` makes the encoder's reference weak, so a
histogram is freed as soon as nothing uses it.
"""

from __future__ import annotations

import base64
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hdrh.histogram import HdrHistogram

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # one hour
SIGNIFICANT_FIGURES = 3


class LagHistogram:
    """An HdrHistogram of microseconds plus an out-of-range counter."""

    def __init__(self) -> None:
        self.hdr = _acyclic(HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES))
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
        if payload:  # what hdr.decode_and_add does, without leaving a cycle behind
            hist.hdr.add(_acyclic(HdrHistogram.decode(payload)))
        hist.out_of_range = out_of_range
        return hist

    def percentile_ms(self, pct: float) -> float | None:
        if self.count == 0:
            return None
        return float(self.hdr.get_value_at_percentile(pct)) / 1000

    def summary_ms(self) -> dict[str, float | None]:
        """mean, p50, p90, p99, p999, max in milliseconds (None when empty).

        Computed over the non-zero buckets with numpy (`SparseHistogram`), exactly as
        hdrh's own percentile and mean walks would, which visit all 23,552 buckets in
        Python (~50 ms, holding the GIL, per call)."""
        return SparseHistogram.from_lag_histogram(self).summary_ms()

    def to_b64(self) -> str:
        return base64.b64encode(self.encode()).decode("ascii")


def _acyclic(hdr: HdrHistogram) -> HdrHistogram:
    """`hdr` with its encoder's back reference made weak (the encoder is only used
    through `hdr`, which is alive then): reference counting frees it, not the collector."""
    hdr.encoder.histogram = weakref.proxy(hdr)
    return hdr


# The geometry of every LagHistogram; used to turn bucket indexes back into values
# exactly as hdrh does (get_value_from_index / get_highest_equivalent_value).
_GEOMETRY = HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES)
_HALF_MAG = int(_GEOMETRY.sub_bucket_half_count_magnitude)
_HALF = int(_GEOMETRY.sub_bucket_half_count)
_UNIT = int(_GEOMETRY.unit_magnitude)
_COUNTS_LEN = int(_GEOMETRY.counts_len)


@dataclass(frozen=True, slots=True)
class SparseHistogram:
    """Non-zero buckets of a LagHistogram: sorted bucket indexes and their counts."""

    index: IntArray
    count: IntArray
    out_of_range: int = 0

    @classmethod
    def from_lag_histogram(cls, hist: LagHistogram) -> SparseHistogram:
        import numpy as np

        dense = np.ctypeslib.as_array(hist.hdr.counts).astype(np.int64)
        index = np.flatnonzero(dense).astype(np.int64)
        return cls(index=index, count=dense[index], out_of_range=hist.out_of_range)

    @classmethod
    def merge(cls, parts: Sequence[SparseHistogram]) -> SparseHistogram:
        import numpy as np

        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls(index=np.zeros(0, np.int64), count=np.zeros(0, np.int64))
        index = np.concatenate([p.index for p in parts])
        count = np.concatenate([p.count for p in parts])
        dense = np.bincount(index, weights=count, minlength=_COUNTS_LEN)
        merged = np.flatnonzero(dense).astype(np.int64)
        return cls(
            index=merged,
            count=np.rint(dense[merged]).astype(np.int64),
            out_of_range=sum(p.out_of_range for p in parts),
        )

    def values_us(self) -> list[tuple[int, int]]:
        """(lowest value of the bucket in µs, count) per non-empty bucket."""
        return list(zip(_value_from_index(self.index).tolist(), self.count.tolist(), strict=True))

    @property
    def total(self) -> int:
        return int(self.count.sum())

    def summary_ms(self) -> dict[str, float | None]:
        """Same keys and values as `LagHistogram.summary_ms()`, in microseconds of numpy."""
        import numpy as np

        total = self.total
        if total == 0:
            return dict.fromkeys(("mean", "p50", "p90", "p99", "p999", "max"))
        cumulative = np.cumsum(self.count)
        lowest = _value_from_index(self.index)
        bucket = np.maximum((self.index >> _HALF_MAG) - 1, 0)
        median = lowest + ((np.int64(1) << (bucket + _UNIT)) >> 1)
        if total * int(median[-1]) < 2**62:  # int64 cannot overflow: exact and vectorised
            weighted = int(np.dot(self.count, median))
        else:
            weighted = sum(int(c) * int(m) for c, m in zip(self.count, median, strict=True))
        mean_us = weighted / total

        def at(pct: float) -> float:
            target = max(int((min(pct, 100.0) * total / 100) + 0.5), 1)
            position = int(np.searchsorted(cumulative, target, side="left"))
            return _highest_equivalent(int(lowest[position])) / 1000

        return {
            "mean": round(mean_us / 1000, 4),
            "p50": at(50),
            "p90": at(90),
            "p99": at(99),
            "p999": at(99.9),
            "max": _highest_equivalent(int(lowest[-1])) / 1000,
        }


def _value_from_index(index: IntArray) -> IntArray:
    import numpy as np

    bucket = (index >> _HALF_MAG) - 1
    sub_bucket = (index & (_HALF - 1)) + _HALF
    first = bucket < 0
    sub_bucket = np.where(first, sub_bucket - _HALF, sub_bucket)
    bucket = np.where(first, 0, bucket)
    return np.asarray(sub_bucket << (bucket + _UNIT), dtype=np.int64)


def _highest_equivalent(value: int) -> int:
    return int(_GEOMETRY.get_highest_equivalent_value(value))


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
