"""Scheduled units and the scheduler that runs them.

A `ScheduledUnit` is one piece of periodic work with a name of its own (each
source region's probe round, replication sampling, Dynomite stats, each
group's scheduled check, retention): what it needs is given to it when it is
built, `interval_s` says when it runs, `run()` does one round. The
`Scheduler` runs every unit on the loop it is started on, each on its own
timer, keeping each alive through a failed round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from replag.errors import ReplagError

log = logging.getLogger("replag.service")


class ScheduledUnit(Protocol):
    """One unit of periodic work. `name` is stable across instances and restarts
    (`probe:REGION`, `replication`, `dynomite-stats`, `check:GROUP`, `retention`)."""

    @property
    def name(self) -> str: ...

    @property
    def interval_s(self) -> float: ...

    async def run(self) -> Any: ...


class Scheduler:
    """Runs units every `interval_s`, from `start()` (on the caller's loop) to `stop()`."""

    def __init__(self, units: Sequence[ScheduledUnit], *, counters: Counter[str]) -> None:
        self.units = list(units)
        self.counters = counters
        self.tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()

    def start(self) -> None:
        self._stopping.clear()
        for unit in self.units:
            self.spawn(unit.name, self._every(unit))

    def spawn(self, name: str, coro: Awaitable[Any]) -> None:
        """Run `coro` as a named task of this scheduler (cancelled by the loop's stop)."""
        self.tasks.append(asyncio.ensure_future(coro))
        self.tasks[-1].set_name(name)

    def stop(self) -> None:
        self._stopping.set()

    async def _every(self, unit: ScheduledUnit) -> None:
        """Run `unit` now and then every `interval_s`, keeping it alive through failures."""
        while not self._stopping.is_set():
            started = time.monotonic()
            await self.run_once(unit)
            delay = max(0.0, unit.interval_s - (time.monotonic() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def run_once(self, unit: ScheduledUnit) -> None:
        try:
            await unit.run()
        except ReplagError as exc:
            log.warning("%s: %s", unit.name, exc)
        except Exception:
            # A bug in one round must not end a service an SRE team relies on: log it
            # with its traceback and try again next round.
            self.counters["crashed rounds"] += 1
            log.exception("%s failed; retrying next round", unit.name)
