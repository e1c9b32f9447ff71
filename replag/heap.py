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


# The longest a thread waits for the GIL before asking its holder to drop it (default
# 5 ms): the API's event loop asks several times per request while the probe rounds'
# thread holds it about 40 % of the time with 100 groups.
SERVICE_SWITCH_INTERVAL_S = 0.0005


def tune_for_service() -> None:
    """The GIL's switch interval for `replag serve`.

    Tried and dropped, for the full passes' pauses that remain (up to a few hundred ms
    with 100 groups on a busy host): raising the young threshold to 50,000 let the probe
    rounds' cyclic garbage, which holds their histograms' arrays, grow the process by
    36 MB every 10 s between passes; freezing again after each slow full pass froze the
    rounds in flight with it (their cycles then never freed): 140 MB to 700 MB in three
    minutes."""
    sys.setswitchinterval(SERVICE_SWITCH_INTERVAL_S)
