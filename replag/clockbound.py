"""How far apart two hosts' wall clocks may be: the error bound lag through agents carries.

A region agent stamps probe arrivals on its host's clock, the prober its writes on
its own; their difference is lag only once the offset between the two clocks is
known, and the sample's error bar must include how well it is known. Two sources:

* **The kernel's own bound** (`adjtimex`, read-only): `maxerror` is the most the
  clock may be from true time, kept by the NTP daemon (chrony, ntpd,
  systemd-timesyncd) at each update and grown by the kernel by 500 ppm between
  updates; `esterror` is its estimate, not a bound. Two synchronised hosts differ
  by at most the sum of their maxerrors. A clock whose status has STA_UNSYNC
  (or whose state is TIME_ERROR) is *unsynchronised*: no daemon disciplines it
  or it lost its sources, maxerror climbs to its 16 s cap and bounds nothing, so
  replag treats the bound as unknown. Where the kernel's estimate is not kept
  but a bound is known (a PTP or ClockBound host; the lab, whose processes share
  one clock), the `clock_error_bound` setting states it instead.
* **A round trip** (Cristian): the other host read its clock somewhere between
  our send and our receipt, so the offset lies in an interval as wide as the
  round trip, whatever the path's asymmetry. Across a WAN that is wide (a
  160 ms round trip bounds the offset to ±80 ms, and its midpoint is off by half
  the asymmetry), so it tightens the bound only where the kernel's is loose.

Both hold, so the offset lies in their intersection; an empty intersection
means a bound was false (a clock lied about its error) and is reported.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from dataclasses import dataclass
from typing import Any

# adjtimex(2): status bit and return values.
_STA_UNSYNC = 0x0040
_STATES = {0: "ok", 1: "leap second insert", 2: "leap second delete", 3: "leap second", 4: "wait"}
_TIME_ERROR = 5


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """struct timex of <sys/timex.h> (Linux), field for field; the trailing ints are padding."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_padding", ctypes.c_int * 11),
    ]


@dataclass(frozen=True, kw_only=True)
class HostClock:
    """What one host knows about its wall clock's error."""

    synchronised: bool
    maxerror_ns: int | None  # a bound on |clock − true time|; None when there is none
    esterror_ns: int | None
    source: str  # "adjtimex", "setting" (clock_error_bound) or "unavailable"
    state: str = "ok"

    @property
    def bound_ns(self) -> int | None:
        return self.maxerror_ns if self.synchronised else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "synchronised": self.synchronised,
            "maxerror_ms": None if self.maxerror_ns is None else self.maxerror_ns / 1e6,
            "esterror_ms": None if self.esterror_ns is None else self.esterror_ns / 1e6,
            "source": self.source,
            "state": self.state,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> HostClock:
        """The other side's `to_dict()`; ValueError/KeyError/TypeError if it is not one."""

        def ns(value: Any) -> int | None:
            return None if value is None else int(float(value) * 1e6)

        return cls(
            synchronised=bool(raw["synchronised"]),
            maxerror_ns=ns(raw["maxerror_ms"]),
            esterror_ns=ns(raw["esterror_ms"]),
            source=str(raw["source"]),
            state=str(raw.get("state", "ok")),
        )


def read_kernel_clock() -> HostClock:
    """The kernel's estimate (adjtimex with modes 0 changes nothing and needs no privilege)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        adjtimex = libc.adjtimex
    except (OSError, AttributeError):
        return HostClock(
            synchronised=False, maxerror_ns=None, esterror_ns=None, source="unavailable"
        )
    timex = _Timex()
    state = adjtimex(ctypes.byref(timex))
    if state < 0:
        return HostClock(
            synchronised=False, maxerror_ns=None, esterror_ns=None, source="unavailable"
        )
    synchronised = state != _TIME_ERROR and not timex.status & _STA_UNSYNC
    return HostClock(
        synchronised=synchronised,
        maxerror_ns=int(timex.maxerror) * 1000,
        esterror_ns=int(timex.esterror) * 1000,
        source="adjtimex",
        state=_STATES.get(state, "unsynchronised"),
    )


def host_clock(configured_bound_s: float | None) -> HostClock:
    """`clock_error_bound` when set, else the kernel's estimate."""
    if configured_bound_s is not None:
        bound = int(configured_bound_s * 1e9)
        return HostClock(synchronised=True, maxerror_ns=bound, esterror_ns=None, source="setting")
    return read_kernel_clock()


@dataclass(frozen=True, slots=True)
class OffsetInterval:
    """The other clock minus ours lies in [lo_ns, hi_ns]."""

    lo_ns: int
    hi_ns: int

    @property
    def estimate_ns(self) -> int:
        return (self.lo_ns + self.hi_ns) // 2

    @property
    def half_width_ns(self) -> int:
        return (self.hi_ns - self.lo_ns + 1) // 2

    def intersect(self, other: OffsetInterval) -> OffsetInterval | None:
        lo, hi = max(self.lo_ns, other.lo_ns), min(self.hi_ns, other.hi_ns)
        return OffsetInterval(lo, hi) if lo <= hi else None

    def hull(self, other: OffsetInterval) -> OffsetInterval:
        return OffsetInterval(min(self.lo_ns, other.lo_ns), max(self.hi_ns, other.hi_ns))


def kernel_interval(ours: HostClock, theirs: HostClock) -> OffsetInterval | None:
    """|their clock − ours| ≤ the sum of both bounds; None when either has none."""
    if ours.bound_ns is None or theirs.bound_ns is None:
        return None
    total = ours.bound_ns + theirs.bound_ns
    return OffsetInterval(-total, total)


def round_trip_interval(their_ns: int, sent_ns: int, received_ns: int) -> OffsetInterval:
    """They read `their_ns` between our wall-clock moments `sent_ns` and `received_ns`."""
    return OffsetInterval(their_ns - received_ns, their_ns - sent_ns)


@dataclass(frozen=True, kw_only=True)
class ClockComparison:
    """The offset of another host's clock against ours, and where its bound comes from."""

    interval: OffsetInterval | None  # None: no bound at all
    source: str  # "kernel", "round trip", "kernel ∩ round trip", "none"
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "note": self.note}
        if self.interval is not None:
            out["offset_ms"] = round(self.interval.estimate_ns / 1e6, 4)
            out["bound_ms"] = round(self.interval.half_width_ns / 1e6, 4)
        else:
            out["offset_ms"] = out["bound_ms"] = None
        return out


def compare_clocks(
    ours: HostClock, theirs: HostClock, round_trip: OffsetInterval | None
) -> ClockComparison:
    """Intersect what the kernels promise with what a round trip showed."""
    kernel = kernel_interval(ours, theirs)
    if kernel is None and round_trip is None:
        return ClockComparison(interval=None, source="none")
    if kernel is None:
        return ClockComparison(interval=round_trip, source="round trip")
    if round_trip is None:
        return ClockComparison(interval=kernel, source="kernel")
    both = kernel.intersect(round_trip)
    if both is None:
        # A round trip cannot lie about physics; a maxerror can be wrong (a daemon that
        # trusts a bad source). Keep the round trip's bound, and say so.
        return ClockComparison(
            interval=round_trip,
            source="round trip",
            note=(
                f"clocks disagree beyond their kernels' bounds (±{kernel.half_width_ns / 1e6:g} "
                f"ms; a round trip puts the offset at {round_trip.estimate_ns / 1e6:+.3f} ms "
                f"± {round_trip.half_width_ns / 1e6:g} ms): a maxerror is wrong"
            ),
        )
    if both == kernel:
        return ClockComparison(interval=kernel, source="kernel")
    if both == round_trip:
        return ClockComparison(interval=round_trip, source="round trip")
    return ClockComparison(interval=both, source="kernel ∩ round trip")


@dataclass(frozen=True, slots=True)
class WallClock:
    """This host's wall clock, optionally shifted (`offset_ns`: the lab's and tests' way to
    give an agent a wrong clock, to show the bounds hold)."""

    offset_ns: int = 0

    def now_ns(self) -> int:
        return time.time_ns() + self.offset_ns

    def wall_minus_monotonic(self) -> tuple[int, int]:
        """(wall − monotonic, uncertainty of that reading) in ns: maps a monotonic stamp to
        the wall clock; the mapping moves only while the clock is slewed or stepped."""
        m0 = time.monotonic_ns()
        wall = self.now_ns()
        m1 = time.monotonic_ns()
        return wall - (m0 + m1) // 2, (m1 - m0) // 2 + 1
