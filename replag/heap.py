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
