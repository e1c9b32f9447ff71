"""Lag windows with known lags, appended straight to a store (API, alert, dashboard tests)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from replag.store import LagWindow, Store

MINUTE_NS = 60 * 10**9


def add_windows(
    store: Store,
    *,
    pairs: Iterable[tuple[str, str, float]],
    minutes: int = 30,
    lost: int = 0,
    end_ns: int | None = None,
    replica: str | None = None,
    silent: bool = False,
) -> int:
    """One window per minute for each (source, target, lag_ms); 50 samples at lag_ms ± 10 %
    on `replica` (default: "<target>-1"), or with `silent` 50 sent and none seen."""
    end_ns = end_ns or time.time_ns()
    windows = []
    for source, target, lag_ms in pairs:
        for minute in range(minutes):
            stop = end_ns - (minutes - 1 - minute) * MINUTE_NS
            w = LagWindow(
                run_id=f"t{minute}",
                source=source,
                target=target,
                replica=replica or f"{target}-1",
                start_ns=stop - MINUTE_NS,
                end_ns=stop,
                sent=50 + lost,
                seen=0 if silent else 50,
                lost=lost + (50 if silent else 0),
            )
            for i in range(0 if silent else 50):
                w.lag.record_us(lag_ms * 1000 * (0.9 + 0.2 * i / 49))
                w.uncertainty.record_us(50)
            w.write.record_us(300)
            windows.append(w)
    store.append_windows(windows)
    return len(windows)
