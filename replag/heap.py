"""Keeping the cyclic garbage collector's pauses out of the API's latency.

A full (generation 2) pass of CPython's collector walks every tracked object while it
holds the GIL, so every thread waits for it. In `replag serve` that was about 130,000
objects (the imported modules, FastAPI's routes and schemas, the warmed lag index), and
a pass took 50–120 ms on a busy 2-core host: each one held up the API requests that
arrived meanwhile (benchmarks/api_load.py). Those objects live as long as the process
and never become garbage. `freeze_long_lived()` moves them to the permanent generation,
so later passes walk only what came after them (about 10,000 objects: 5–10 ms).

Frozen objects are still freed by reference counting when they are dropped; only a
reference cycle among them would outlive its use, and the objects frozen here are
module-level state and caches that do not form garbage cycles.
"""

from __future__ import annotations

import gc
import logging
import sys
import time

log = logging.getLogger(__name__)


def freeze_long_lived(stage: str) -> int:
    """Collect what is garbage now, then hide everything left from later collections.

    Returns how many objects are frozen in all (this call and earlier ones).
    """
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("heap frozen after %s: %d objects", stage, frozen)
    return frozen


class FullPassWatch:
    """Freezes the heap again right after a slow full pass, so the next ones are short.

    A service watching a fleet keeps growing after start-up (each source's metrics
    series, the lag index's windows, the answers cached over them): with 100 groups,
    full passes over what accumulated took 400–550 ms on a busy 2-core host, every
    minute or so while the heap grew, and stalled every API request meanwhile. What a
    full pass leaves is alive (every generation was just collected), and in this
    process mostly long-lived: when the pass took over `slow_s` of CPU, the callback
    moves it to the permanent generation at once, before anything new is allocated.
    It is self-limiting: right after a freeze passes are short again, so it happens
    only when much new long-lived state has built up. What it may keep is a reference
    cycle that was alive then and becomes garbage later (an in-flight task's): bounded
    by what was in flight at each of these few freezes. `report()` logs them (never
    from the collector's callback).
    """

    def __init__(self, *, slow_s: float = 0.02) -> None:
        self.slow_s = slow_s
        self.freezes = 0
        self._reported = 0
        self._slowest_s = 0.0
        self._started = 0.0
        gc.callbacks.append(self._timed)

    def _timed(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        # CPU time of the collecting thread: on a busy host a short pass can take long on
        # the wall clock (the thread waited for a core), and freezing cannot help that.
        if phase == "start":
            self._started = time.thread_time()
            return
        took = time.thread_time() - self._started
        if took > self.slow_s:
            gc.freeze()
            self.freezes += 1
            self._slowest_s = max(self._slowest_s, took)

    def report(self) -> None:
        if self.freezes != self._reported:
            log.info(
                "slow full garbage collections (up to %.0f ms of CPU): %d long-lived "
                "objects frozen (%d times so far)",
                self._slowest_s * 1000,
                gc.get_freeze_count(),
                self.freezes,
            )
            self._reported, self._slowest_s = self.freezes, 0.0

    def close(self) -> None:
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)


# The longest a thread waits for the GIL before asking its holder to drop it (default
# 5 ms): the API's event loop asks several times per request while the probe rounds'
# thread holds it about 40 % of the time with 100 groups.
SERVICE_SWITCH_INTERVAL_S = 0.0005


def tune_for_service() -> None:
    """The GIL's switch interval for `replag serve`. (The collector's thresholds stay
    CPython's: raising the young one to 50,000 let a probe round's cyclic garbage, which
    holds its histograms' arrays, grow the process by 36 MB every 10 s before a pass.)"""
    sys.setswitchinterval(SERVICE_SWITCH_INTERVAL_S)
