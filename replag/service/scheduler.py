"""Scheduled units and the scheduler that runs them.

A `ScheduledUnit` is one piece of periodic work with a name of its own (each
source region's probe round, replication sampling, Dynomite stats, alert
evaluation, each group's scheduled check, retention): what it needs is given
to it when it is built, `interval_s` says when it runs, `run(fence)` does one
round, and `claim` says how an instance comes to own it when several share
one store:

- `"lease"`: continuous ownership through a lease in the store
  (`replag.service.leasing`), renewed while the instance lives; another
  instance takes it when it is released, offered (hand-over to share the work)
  or expired with its holder dead. The unit checks its `Fence` before acting
  outside the store; the fence stays valid while the store cannot be reached.
- `"slot"`: periodic work claimed per time slot (`floor(database time /
  interval)`) with a unique insert: whichever instance inserts the slot's row
  runs that slot; no scheduler is elected.

Without a `LeaseKeeper` (a library user's service, one process) every unit
simply runs on its timer. The scheduler keeps each unit alive through a failed
round.

Units that say `staggered = True` (the probe rounds) do not all start at once: the
k-th of n such units with one interval first runs k/n of the interval after the
start. With 100 groups, 100 rounds starting together kept 100 rounds' histograms
alive at the same moment and made the API wait behind all of them, every interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, Protocol

from replag.errors import LeaseLost, ReplagError, StoreError
from replag.logfields import bind_log_fields, unit_fields

if TYPE_CHECKING:
    from replag.service.leasing import Fence, LeaseKeeper
    from replag.service.slots import SlotClaims

log = logging.getLogger("replag.service")

# "every": each instance runs it (work whose own claims are in the store, the job table).
Claim = Literal["lease", "slot", "every"]


class ScheduledUnit(Protocol):
    """One unit of periodic work. `name` is stable across instances and restarts
    (`probe:REGION`, `replication`, `dynomite-stats`, `alerts`, `check:GROUP`,
    `retention`)."""

    @property
    def name(self) -> str: ...

    @property
    def interval_s(self) -> float: ...

    @property
    def claim(self) -> Claim: ...

    async def run(self, fence: Fence | None = None) -> Any: ...


class Scheduler:
    """Runs units every `interval_s`, from `start()` (on the caller's loop) to `stop()`."""

    def __init__(
        self,
        units: Sequence[ScheduledUnit],
        *,
        counters: Counter[str],
        keeper: LeaseKeeper | None = None,
        slots: SlotClaims | None = None,
    ) -> None:
        self.units = list(units)
        self.counters = counters
        self.keeper = keeper
        self.slots = slots
        self.tasks: list[asyncio.Task[None]] = []
        # Each unit's task while it runs, by the unit's name (see `replace`).
        self._running: dict[str, tuple[ScheduledUnit, asyncio.Task[None]]] = {}
        self._stopping = asyncio.Event()
        # The keeper's round trips run on a thread of their own, never queued behind the
        # event loop's shared threads: those may all be waiting on the store (writes wait
        # while the held ones are replayed after an outage, seconds on a busy host), and
        # a renewal that waits behind them lets this instance's leases expire.
        self._lease_thread: ThreadPoolExecutor | None = None

    def start(self) -> None:
        self._stopping.clear()
        if self.keeper is not None:
            self.spawn("leases", self._keep_leases(self.keeper))
        offsets = stagger_offsets(self.units)
        for unit in self.units:
            self._start_unit(unit, offsets.get(unit.name, 0.0))

    def _start_unit(self, unit: ScheduledUnit, offset_s: float = 0.0) -> None:
        # The task copies the context here: every line its rounds log names the unit.
        with bind_log_fields(**unit_fields(unit.name)):
            self._spawn_unit(unit, offset_s)
        self._running[unit.name] = (unit, self.tasks[-1])

    def _spawn_unit(self, unit: ScheduledUnit, offset_s: float) -> None:
        if self.keeper is not None and unit.claim == "lease":
            self.spawn(unit.name, self._leased(unit, self.keeper, offset_s))
        elif self.slots is not None and unit.claim == "slot":
            self.spawn(unit.name, self._per_slot(unit, self.slots))
        else:
            self.spawn(unit.name, self._every(unit, offset_s))

    async def replace(self, units: Sequence[ScheduledUnit]) -> None:
        """Run `units` from now on (on the loop `start` ran on): a unit kept (the same
        object) runs on undisturbed; one gone or replaced is cancelled, its lease released
        and its gauges dropped; a new one starts."""
        wanted = {u.name: u for u in units}
        for name, (unit, task) in list(self._running.items()):
            if wanted.get(name) is unit:
                continue
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self.tasks.remove(task)
            del self._running[name]
            if self.keeper is not None and unit.claim == "lease":
                await asyncio.to_thread(self.keeper.release, name)
            _disown(unit)
        self.units = list(units)
        if self.keeper is not None:
            self.keeper.units = sum(u.claim == "lease" for u in units)
        for unit in units:
            if unit.name not in self._running:
                self._start_unit(unit)

    def spawn(self, name: str, coro: Awaitable[Any]) -> None:
        """Run `coro` as a named task of this scheduler (cancelled by the loop's stop)."""
        self.tasks.append(asyncio.ensure_future(coro))
        self.tasks[-1].set_name(name)

    def stop(self) -> None:
        self._stopping.set()

    def clear(self) -> None:
        """Forget the tasks (the loop they ran on has ended)."""
        self.tasks.clear()
        self._running.clear()
        if self._lease_thread is not None:
            self._lease_thread.shutdown(wait=False)
            self._lease_thread = None

    async def _on_lease_thread(self, call: Callable[[], Any]) -> Any:
        if self._lease_thread is None:
            self._lease_thread = ThreadPoolExecutor(1, thread_name_prefix="replag-leases")
        return await asyncio.get_running_loop().run_in_executor(self._lease_thread, call)

    async def _sleep(self, delay_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), max(0.0, delay_s))

    async def _every(self, unit: ScheduledUnit, offset_s: float = 0.0) -> None:
        """Run `unit` after `offset_s`, then every `interval_s`, keeping it alive through
        failures."""
        await self._sleep(offset_s)
        while not self._stopping.is_set():
            started = time.monotonic()
            await self.run_once(unit)
            await self._sleep(unit.interval_s - (time.monotonic() - started))

    async def _leased(
        self, unit: ScheduledUnit, keeper: LeaseKeeper, offset_s: float = 0.0
    ) -> None:
        """Run `unit` every `interval_s` while this instance holds its lease (offering it
        between rounds while above its fair share, see `_share`); else try to take it
        every third of the lease time or half the interval, whichever is shorter: a free
        one always, an offered one while under the fair share. The first round waits
        `offset_s` (see `stagger_offsets`)."""
        # A free unit (released by a stopping instance) is taken within this, so a unit is
        # never unowned for longer than about half its interval.
        retry_s = min(keeper.ttl_s / 3, unit.interval_s / 2)
        await self._sleep(offset_s)
        while not self._stopping.is_set():
            fence = keeper.fence(unit.name)
            if fence is not None:
                fence = await self._share(unit, keeper, fence)
            if fence is None:
                if keeper.held(unit.name) is not None:
                    keeper.forget(unit.name)
                    _disown(unit)
                if keeper.settled():
                    try:
                        # Free units always; offered ones only while under the fair share.
                        fence = await asyncio.to_thread(
                            keeper.try_acquire, unit.name, offered=keeper.reserve_take()
                        )
                    except StoreError as exc:
                        log.warning("%s: lease not taken (%s)", unit.name, exc)
                if fence is None:
                    await self._sleep(retry_s)
                    continue
            started = time.monotonic()
            await self.run_once(unit, fence)
            await self._sleep(unit.interval_s - (time.monotonic() - started))

    async def _share(self, unit: ScheduledUnit, keeper: LeaseKeeper, fence: Fence) -> Fence | None:
        """Between two rounds: offer `unit` if this instance is above its fair share (it
        runs it until another instance takes it: no gap), withdraw the offer once it is
        not; an offered unit asks the store first whether it was taken (then None: this
        instance stops it at once, before another round)."""
        try:
            if keeper.offered(unit.name):
                if not keeper.over_share(extra=1):
                    await asyncio.to_thread(keeper.withdraw, unit.name)
                else:
                    await asyncio.to_thread(fence.confirm)
                    await asyncio.to_thread(keeper.offer, unit.name)  # renewed while it waits
            elif keeper.settled() and keeper.offer_if_over_share():
                await asyncio.to_thread(keeper.offer, unit.name, reserved=True)
        except LeaseLost as exc:
            log.info("%s: handed over (%s)", unit.name, exc)
            return None
        except StoreError as exc:
            log.warning("%s: offer not changed (%s)", unit.name, exc)
        return fence

    async def _per_slot(self, unit: ScheduledUnit, slots: SlotClaims) -> None:
        """Try to claim each `interval_s` slot of `unit`; run it where the claim succeeds."""
        poll_s = min(unit.interval_s / 4, 5.0)
        while not self._stopping.is_set():
            try:
                claimed = await asyncio.to_thread(slots.claim, unit.name, unit.interval_s)
            except StoreError as exc:
                log.warning("%s: slot not claimed (%s)", unit.name, exc)
                claimed = False
            if claimed:
                await self.run_once(unit)
            await self._sleep(poll_s)

    async def _keep_leases(self, keeper: LeaseKeeper) -> None:
        """Renew every third of the lease time; hold this instance's own lease."""
        while not self._stopping.is_set():
            try:
                # Back from a store outage: renew what it holds first (its leases expired
                # meanwhile; the others wait for its own lease before taking any).
                away = keeper.away_since() is not None
                if not away:
                    await self._on_lease_thread(keeper.heartbeat)
                lost: list[str] = await self._on_lease_thread(keeper.renew_all)
                if away:
                    await self._on_lease_thread(keeper.heartbeat)
                for name in lost:
                    # Lost (taken over): its gauges go now, not at the unit's next round.
                    running = self._running.get(name)
                    if running is not None:
                        _disown(running[0])
            except StoreError as exc:
                log.warning("leases: not renewed (%s)", exc)
            except Exception:
                self.counters["crashed rounds"] += 1
                log.exception("leases: renewal failed; retrying")
            # While the store is away, look again soon: the units renew at once when it
            # answers; and after it, while catching up (`LeaseKeeper.catching_up`).
            soon = keeper.away_since() is not None or keeper.catching_up()
            await self._sleep(min(keeper.ttl_s / 3, 0.5) if soon else keeper.ttl_s / 3)

    async def run_once(self, unit: ScheduledUnit, fence: Fence | None = None) -> None:
        try:
            await unit.run(fence)
        except LeaseLost as exc:
            self.counters["rounds stopped by a lost lease"] += 1
            log.warning("%s: stopped: %s", unit.name, exc)
        except ReplagError as exc:
            log.warning("%s: %s", unit.name, exc)
        except Exception:
            # A bug in one round must not end a service an SRE team relies on: log it
            # with its traceback and try again next round.
            self.counters["crashed rounds"] += 1
            log.exception("%s failed; retrying next round", unit.name)


def stagger_offsets(units: Sequence[ScheduledUnit]) -> dict[str, float]:
    """How long each staggered unit waits before its first round: the k-th of the n
    staggered units sharing an interval waits k/n of it (the first one not at all)."""
    by_interval: dict[float, list[str]] = {}
    for unit in units:
        if getattr(unit, "staggered", False):
            by_interval.setdefault(unit.interval_s, []).append(unit.name)
    return {
        name: interval * k / len(names)
        for interval, names in by_interval.items()
        for k, name in enumerate(names)
    }


def _disown(unit: ScheduledUnit) -> None:
    """This instance stopped running `unit`: it stops exporting what the unit measured
    (its gauges), so /metrics scraped on every instance counts each thing once."""
    disown = getattr(unit, "disown", None)
    if disown is not None:
        disown()
