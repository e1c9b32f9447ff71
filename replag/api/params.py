"""Query parameters shared by the lag endpoints: times, ranges and steps, validated once.

A time is relative ("15m" or "7d" ago, "now"), Unix seconds ("1718000000.5") or ISO 8601
("2024-06-10T12:00:00Z"; no offset means UTC). Anything else is a UsageError,
which the app turns into a 400 naming the parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from replag.durations import parse_duration_ns
from replag.errors import UsageError

_MIN_NS = 0
_MAX_NS = 7_258_118_400 * 10**9  # 2200-01-01: anything later is a typo, not a query
MAX_POINTS = 5000


def duration_ns(text: str) -> int:
    """parse_duration_ns plus days ("7d"), which ranges need and probe settings do not."""
    text = text.strip()
    if text.endswith("d") and text[:-1].replace(".", "", 1).isdigit():
        return int(float(text[:-1]) * 86_400 * 10**9)
    return parse_duration_ns(text)


def parse_time(value: str | None, *, name: str, now_ns: int, default_ns: int) -> int:
    if value is None or value == "":
        return default_ns
    text = value.strip()
    if text == "now":
        return now_ns
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if math.isfinite(seconds):
        return _bounded(int(seconds * 1e9), name=name, value=value)
    try:
        return _bounded(now_ns - duration_ns(text), name=name, value=value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        moment_ns = int(moment.timestamp() * 1e9)
    except (ValueError, OverflowError):
        raise UsageError(
            f"{name}: expected a duration ago (15m), Unix seconds or ISO 8601, got {value!r}"
        ) from None
    return _bounded(moment_ns, name=name, value=value)


def _bounded(ns: int, *, name: str, value: str) -> int:
    if not _MIN_NS <= ns <= _MAX_NS:
        raise UsageError(f"{name}: {value!r} is outside 1970–2200")
    return ns


@dataclass(frozen=True, slots=True)
class TimeRange:
    since_ns: int
    until_ns: int

    @classmethod
    def parse(
        cls, since: str | None, until: str | None, *, now_ns: int, default_since_s: float
    ) -> TimeRange:
        since_ns = parse_time(
            since, name="since", now_ns=now_ns, default_ns=now_ns - int(default_since_s * 1e9)
        )
        # Windows are stored when they end: `until` defaults to just after now.
        until_ns = parse_time(until, name="until", now_ns=now_ns, default_ns=now_ns + 1)
        if since_ns >= until_ns:
            raise UsageError(f"since ({since}) must be before until ({until or 'now'})")
        return cls(since_ns=since_ns, until_ns=until_ns)

    def step_ns(self, step: str | None, *, minimum_s: float) -> int:
        """The series step: given, or chosen so the chart has about 240 points."""
        span = self.until_ns - self.since_ns
        if step is None or step == "":
            wanted = max(int(minimum_s * 1e9), span // 240, 1_000_000_000)
            return -(-wanted // 1_000_000_000) * 1_000_000_000
        try:
            step_ns = duration_ns(step)
        except ValueError as exc:
            raise UsageError(f"step: {exc}") from None
        if step_ns < 1_000_000_000:
            raise UsageError(f"step: at least 1s, got {step!r}")
        if span // step_ns > MAX_POINTS:
            raise UsageError(f"step: {step!r} gives more than {MAX_POINTS} points for this range")
        return step_ns
