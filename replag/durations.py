"""Parsing and printing of durations ("80ms", "5s", "1m") and sizes ("16kb") for config and CLI."""

from __future__ import annotations

import math
import re

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
    "d": 86_400_000_000_000,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|m|h|d)?\s*$")


def parse_duration_ns(text: str | float | int, *, default_unit: str = "s") -> int:
    """Parse "80ms", "1.5s", "2m" or a bare number (in `default_unit`) into nanoseconds."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        if not math.isfinite(text) or text < 0:
            raise ValueError(f"not a finite, non-negative duration: {text!r}")
        return int(text * _UNITS_NS[default_unit])
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 80ms, 5s, 2m)")
    number, unit = match.groups()
    return int(float(number) * _UNITS_NS[unit or default_unit])


def parse_duration_s(text: str | float | int, *, default_unit: str = "s") -> float:
    return parse_duration_ns(text, default_unit=default_unit) / 1e9


def format_ms(value_ms: float | None) -> str:
    """A lag figure for humans: 3 significant decimals below 10 ms."""
    if value_ms is None:
        return "-"
    if value_ms < 10:
        return f"{value_ms:.3f}"
    if value_ms < 1000:
        return f"{value_ms:.1f}"
    return f"{value_ms:.0f}"


def format_span(seconds: float) -> str:
    """How long something lasted, for humans: 45s, 4m12s, 2h05m, 3d4h."""
    total = max(0, round(seconds))
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


_SIZE_UNITS = {"": 1, "b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}


def parse_bytes(text: str | int) -> int:
    """`16kb`, `1mb`, `4096` (or an int) → bytes, in binary units as redis.conf reads them."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"not a size: {text!r}")
        return text
    number = text.strip().lower().removesuffix("ib").removesuffix("b")
    digits = number.rstrip("kmg")
    unit = number[len(digits) :]
    unit = unit + "b" if unit else ""
    if not digits.isdigit() or unit not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r} (expected e.g. 16kb, 1mb or bytes)")
    return int(digits) * _SIZE_UNITS[unit]
