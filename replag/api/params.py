"""Query parameters shared by the lag endpoints: times, ranges and steps, validated once.

A time is relative ("15m" or "7d" ago, "now"), Unix seconds ("1718000000.5") or ISO 8601
("2024-06-10T12:00:00Z"; no offset means UTC). The OpenAPI schema says exactly that
(a pattern, or a date-time), so FastAPI refuses anything else with a 422 naming the
parameter; every value the schema allows gets an answer: times are clamped to
1970–2200, a range whose start is not before its end is empty, and a step is raised to
1 s or to what keeps a series within `MAX_POINTS`. Called with text from elsewhere
(the library), a malformed time is a UsageError.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Query
from pydantic import BeforeValidator, StringConstraints

from replag.durations import parse_duration_ns
from replag.errors import UsageError

_MIN_NS = 0
_MAX_NS = 7_258_118_400 * 10**9  # 2200-01-01: anything later is a typo, not a query
MAX_POINTS = 5000

# "now", Unix seconds, or a duration ago; ISO 8601 is the schema's date-time alternative.
TIME_PATTERN = r"^(now|\d{1,12}(\.\d{1,9})?|\d{1,9}(\.\d{1,6})?(ns|us|µs|ms|s|m|h|d))$"
STEP_PATTERN = r"^\d{1,9}(s|m|h|d)$"
TIME_HELP = "a duration ago (15m, 7d), now, Unix seconds or ISO 8601 (UTC unless an offset)"
TimeText = Annotated[str, StringConstraints(pattern=TIME_PATTERN)]


def _iso_only(value: object) -> object:
    # Pydantic's datetime would also take "1e16" or "-5" (Unix seconds, outside the
    # pattern above): the date-time branch takes dates only, as its schema says.
    if isinstance(value, str) and not _ISO_START.match(value):
        raise ValueError("not an ISO 8601 date-time")
    return value


_ISO_START = re.compile(r"^\d{4}-\d{2}-\d{2}")
IsoTime = Annotated[datetime, BeforeValidator(_iso_only)]
Time = Annotated[IsoTime | TimeText | None, Query(description=TIME_HELP)]
Step = Annotated[
    str | None,
    Query(pattern=STEP_PATTERN, description="bucket length, e.g. 1m (default: ~240 points)"),
]


def duration_ns(text: str) -> int:
    """parse_duration_ns plus days ("7d"), which ranges need and probe settings do not."""
    text = text.strip()
    if text.endswith("d") and text[:-1].replace(".", "", 1).isdigit():
        return int(float(text[:-1]) * 86_400 * 10**9)
    return parse_duration_ns(text)


def parse_time(value: str | datetime | None, *, name: str, now_ns: int, default_ns: int) -> int:
    """UTC epoch ns of `value`, clamped to 1970–2200; UsageError if it is not a time."""
    if value is None or value == "":
        return default_ns
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return _clamped(moment.timestamp() * 1e9)
    text = value.strip()
    if text == "now":
        return now_ns
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if math.isfinite(seconds):
        return _clamped(seconds * 1e9)
    try:
        return _clamped(now_ns - duration_ns(text))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{name}: expected a duration ago (15m), Unix seconds or ISO 8601, got {value!r}"
        ) from None
    return parse_time(moment, name=name, now_ns=now_ns, default_ns=default_ns)


def _clamped(ns: float) -> int:
    return int(min(max(ns, _MIN_NS), _MAX_NS))


@dataclass(frozen=True, slots=True)
class TimeRange:
    since_ns: int
    until_ns: int

    @classmethod
    def parse(
        cls,
        since: str | datetime | None,
        until: str | datetime | None,
        *,
        now_ns: int,
        default_since_s: float,
    ) -> TimeRange:
        """The range asked for; one whose start is not before its end is empty (until = since)."""
        since_ns = parse_time(
            since, name="since", now_ns=now_ns, default_ns=now_ns - int(default_since_s * 1e9)
        )
        # Windows are stored when they end: `until` defaults to just after now.
        until_ns = parse_time(until, name="until", now_ns=now_ns, default_ns=now_ns + 1)
        return cls(since_ns=since_ns, until_ns=max(since_ns, until_ns))

    @property
    def empty(self) -> bool:
        return self.until_ns <= self.since_ns

    def step_ns(self, step: str | None, *, minimum_s: float) -> int:
        """The series step: given (at least 1 s, and coarse enough for `MAX_POINTS`), or
        chosen so the chart has about 240 points."""
        span = self.until_ns - self.since_ns
        if step is None or step == "":
            wanted = max(int(minimum_s * 1e9), span // 240, 1_000_000_000)
        else:
            try:
                wanted = duration_ns(step)
            except ValueError as exc:
                raise UsageError(f"step: {exc}") from None
            wanted = max(wanted, 1_000_000_000, -(-span // MAX_POINTS))
        return -(-wanted // 1_000_000_000) * 1_000_000_000
