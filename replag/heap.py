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
    """Freezes the heap again after a slow full pass, so the next ones are short.

    A service watching a fleet keeps growing after start-up (each source's metrics
    series, the lag index's windows, the answers cached over them): with 100 groups,
    full passes over what accumulated took 400–550 ms on a busy 2-core host, every
    minute or so while the heap grew, and stalled every API request meanwhile. The
    objects a full pass leaves are alive and, in this process, mostly long-lived; once
    a pass took over `slow_s`, `freeze_if_slow()` (called by the service every few
    seconds, off the collector's callback) moves them to the permanent generation.
    It is self-limiting: right after a freeze passes are short again, so it happens
    only when much new long-lived state has built up. What it may keep is a reference
    cycle that was alive then and becomes garbage later (an in-flight task's): bounded
    by what was in flight at each of these few freezes.
    """

    def __init__(self, *, slow_s: float = 0.03) -> None:
        self.slow_s = slow_s
        self.slowest_s = 0.0  # the slowest full pass since the last freeze
        self.freezes = 0
        self._started = 0.0
        gc.callbacks.append(self._timed)

    def _timed(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.slowest_s = max(self.slowest_s, time.perf_counter() - self._started)

    def freeze_if_slow(self) -> bool:
        if self.slowest_s <= self.slow_s:
            return False
        slowest, self.slowest_s = self.slowest_s, 0.0
        gc.freeze()
        self.freezes += 1
        log.info(
            "a full garbage collection took %.0f ms: %d long-lived objects frozen",
            slowest * 1000,
            gc.get_freeze_count(),
        )
        return True

    def close(self) -> None:
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)


# A young pass every 50,000 net allocations (CPython's default: 700) and a full one
# considered after 100 middle passes (default 10): a probe round's objects live a few
# seconds, long enough to be promoted by the default's frequent young passes, and each
# promotion brought a full pass closer; most of them die by reference counting anyway.
SERVICE_THRESHOLDS = (50_000, 20, 100)
# The longest a thread waits for the GIL before asking its holder to drop it (default
# 5 ms): the API's event loop asks several times per request while the probe rounds'
# thread holds it about 40 % of the time with 100 groups.
SERVICE_SWITCH_INTERVAL_S = 0.0005


def tune_for_service() -> None:
    """The collector's thresholds and the GIL's switch interval for `replag serve`."""
    gc.set_threshold(*SERVICE_THRESHOLDS)
    sys.setswitchinterval(SERVICE_SWITCH_INTERVAL_S)
