"""Who owns which scheduled unit: leases in the store, kept by one `LeaseKeeper` per instance.

Every unit (`probe:REGION`, `replication`, `dynomite-stats`, `alerts`) is run by
the instance holding its lease (`replag.store.leases`). The keeper takes free or
expired leases, renews what it holds every third of `lease_time`, and gives up
leases above its fair share (the units over the live instances, rounded up), so
instances share the work. Each instance also holds `instance:ID`: the live
instances are those whose lease has not expired on the database's clock.

A `Fence` is a unit's proof of ownership, checked before acting outside the
store: `check()` is local and cheap (the lease is surely held until the moment
its last confirmation was *asked for* plus most of `lease_time`, measured on
this process's monotonic clock, which keeps counting while the process is
stopped), `confirm()` asks the store (epoch and expiry on the database's clock).
A process paused past its lease fails both on waking, before any write.

**While the store cannot be reached** nobody can take a lease (a takeover is a
write), so a unit whose lease was surely held when the outage began stays this
instance's: its fence stays valid and watching (probes, sampling, alert
evaluation) goes on, its store writes held (`replag.store.backlog`). When the
store answers, the keeper renews what it holds first (reviving a lease that
expired meanwhile if nobody took it: same holder, same epoch) and takes nothing
else for half a renewal period, so instances coming back together keep their
own units. An instance cut off from a store the others still reach keeps
probing too, until it reaches the store and learns its leases were taken.
Repairs have leases of their own and stop (`replag.repair.exclusive`).

**Sharing without churn:** a unit is taken only from nobody: free, released, or
expired with its holder's own `instance:` lease expired too (an instance that
still renews is never robbed). An instance above its fair share does not drop a
unit: it offers it, runs it until another instance under its share takes it,
and learns of the hand-over before its next round, so a unit is never unowned.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from replag.errors import LeaseLost, StoreError
from replag.store import Store, Transaction, held_marks, leases
from replag.store.leases import INSTANCE_PREFIX, OFFER_PREFIX, Lease

log = logging.getLogger("replag.service")

__all__ = ["INSTANCE_PREFIX", "OFFER_PREFIX", "Fence", "LeaseKeeper"]
# Act only while at least this fraction of the lease is left by the local clock: the rest
# covers a clock running slightly fast or slow and an action started just before.
_SAFE_FRACTION = 0.75


@dataclass
class _Held:
    lease: Lease
    confirmed_mono: float  # monotonic time just before the request that confirmed it
    lost: bool = False


class Fence:
    """The lease of one unit as this instance holds it now, at its current epoch (see
    module docstring). It stays bound to that epoch: after the lease was lost and taken
    back (by this instance too) at a later epoch, this fence is no longer valid, so what
    was decided under the old epoch (a queued notification) is not also acted on under
    the new one, where the new owner adopts it."""

    def __init__(self, keeper: LeaseKeeper, name: str) -> None:
        self.keeper = keeper
        self.name = name
        held = keeper.held(name)
        self._epoch = held.lease.epoch if held else 0

    @property
    def epoch(self) -> int:
        return self._epoch

    def valid(self) -> bool:
        held = self.keeper.held(self.name)
        if held is None or held.lost or held.lease.epoch != self._epoch:
            return False
        surely_until = held.confirmed_mono + self.keeper.ttl_s * _SAFE_FRACTION
        if self.keeper.clock() < surely_until:
            return True
        # The store went away while the lease was surely held: nobody can take it over
        # until the store is back (see the module docstring).
        away = self.keeper.away_since()
        return away is not None and away < surely_until

    def check(self) -> None:
        """Raise LeaseLost unless the lease is surely still this instance's (no I/O)."""
        if not self.valid():
            raise LeaseLost(f"lease {self.name} is no longer held by {self.keeper.holder}")

    def guard(self, tx: Transaction) -> None:
        """Inside a transaction: LeaseLost (rolling it back) unless still held at this epoch."""
        self.check()
        held = self.keeper.held(self.name)
        assert held is not None
        leases.guard(tx, self.keeper.store, held.lease)

    def confirm(self) -> None:
        """`check`, then ask the store: still held at this epoch (blocking, one round trip)."""
        self.check()
        held = self.keeper.held(self.name)
        assert held is not None
        try:
            ok = leases.holds(self.keeper.store, held.lease)
        except StoreError as exc:
            if self.keeper.away_since() is not None and self.valid():
                return  # the store is away: watching goes on, its writes held
            raise LeaseLost(f"lease {self.name}: the store cannot confirm it ({exc})") from None
        if not ok:
            self.keeper.mark_lost(self.name)
            raise LeaseLost(f"lease {self.name} was taken over (epoch {held.lease.epoch} is old)")


class LeaseKeeper:
    """Takes, renews and gives up this instance's leases (blocking calls: run in a thread)."""

    def __init__(
        self,
        store: Store,
        *,
        holder: str,
        ttl_s: float,
        units: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.holder = holder
        self.ttl_s = ttl_s
        self.units = units  # leased units in the configuration (every instance has the same)
        self.clock = clock
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self.live_instances = 1
        # The instances and the units each owns, as the last heartbeat read them (health
        # shows this, from memory).
        self.owners: dict[str, list[str]] = {}
        # On the monotonic clock: since when the store has been away (None: it is not),
        # and when it answered again after an outage.
        self._away_mono: float | None = None
        self._back_mono: float | None = None
        # The other instances live when the store went away (the last heartbeat's), and
        # when this one last marked that it holds no write (`held_marks`; monotonic).
        self.peers_when_away: frozenset[str] = frozenset()
        self._marked_mono: float | None = None
        # The live instances as the last heartbeat read them, and when (monotonic) it asked.
        self._live_seen: tuple[float, frozenset[str]] = (-math.inf, frozenset())
        self._offered: set[str] = set()
        self._taking = 0  # acquisitions of offered units under way (see `reserve_take`)
        self._reserved = 0  # offers decided, not yet written (see `offer_if_over_share`)

    # --- what the units ask ---------------------------------------------------------

    def held(self, name: str) -> _Held | None:
        with self._lock:
            return self._held.get(name)

    def holds(self, name: str) -> bool:
        """Whether `name` is held and surely valid now (local check)."""
        return Fence(self, name).valid()

    def fence(self, name: str) -> Fence | None:
        fence = Fence(self, name)
        return fence if fence.valid() else None

    def held_names(self) -> list[str]:
        with self._lock:
            return sorted(n for n, h in self._held.items() if not h.lost and n != self.me)

    @property
    def me(self) -> str:
        return INSTANCE_PREFIX + self.holder

    def fair_share(self) -> int:
        return max(1, math.ceil(self.units / max(1, self.live_instances)))

    def over_share(self, *, extra: int = 0) -> bool:
        """Above its fair share, counting what it offers already (less `extra` of them):
        offer one more."""
        with self._lock:
            offered = len(self._offered) - extra
        return len(self.held_names()) - offered > self.fair_share()

    def offered(self, name: str) -> bool:
        with self._lock:
            return name in self._offered

    def away_since(self) -> float | None:
        """Since when (monotonic) the store has been away, until the first renewal after
        it answers again; None while it answers."""
        if self._away_mono is None and not self.store.reachable:
            # When the store first failed to answer (any statement), not when this asked.
            began = self.store.health.unreachable_mono
            self._went_away(self.clock() if began is None else min(began, self.clock()))
        return self._away_mono

    def _went_away(self, since_mono: float) -> None:
        self._away_mono = since_mono
        self.peers_when_away = self._live_seen[1] - {self.holder}

    @property
    def back_mono(self) -> float | None:
        """When (monotonic) the first renewal after the last store outage went through."""
        return self._back_mono

    def catching_up(self) -> bool:
        """Back from an outage, and not yet marked as holding nothing (see `heartbeat`) or
        not yet seeing every instance live again (see `settled`), for a lease time at most:
        the keeper beats more often meanwhile, so the others (and this one) wait less."""
        back = self._back_mono
        if back is None or self.clock() - back >= self.ttl_s:
            return False
        seen_mono, live = self._live_seen
        marked = self._marked_mono is not None and self._marked_mono >= back
        return not marked or seen_mono < back or not self.peers_when_away <= live

    def settled(self) -> bool:
        """Whether this instance may take units: not while the store is away, nor after it
        answered again until every instance live when it went away holds its `instance:`
        lease again (renewed: it keeps its units, which expired meanwhile), for half a
        renewal period at least and a lease time at most (one not back by then died, or is
        still cut off: its units are taken as usual)."""
        if self.away_since() is not None:
            return False
        back = self._back_mono
        if back is None:
            return True
        waited = self.clock() - back
        if waited >= self.ttl_s:
            return True
        if waited < self.ttl_s / 6:
            return False
        seen_mono, live = self._live_seen
        return seen_mono >= back and self.peers_when_away <= live

    # --- store round trips (blocking) --------------------------------------------------

    def reserve_take(self) -> bool:
        """Whether this instance, under its fair share, may take one more offered unit; if
        so, that take is counted until `try_acquire(…, offered=True)` ends (atomic: units
        deciding at once take no more than the share between them)."""
        with self._lock:
            held = sum(1 for n, h in self._held.items() if not h.lost and n != self.me)
            if held + self._taking >= self.fair_share():
                return False
            self._taking += 1
            return True

    def try_acquire(self, name: str, *, offered: bool = False) -> Fence | None:
        """Take `name` if nobody holds it (free, released, or expired with its holder dead),
        or, with `offered` (reserved by `reserve_take`), if its holder offers it; None
        otherwise."""
        asked = self.clock()
        try:
            lease = leases.acquire(
                self.store,
                name,
                holder=self.holder,
                ttl_s=self.ttl_s,
                live_holders=name != self.me,
                offered=offered,
            )
        finally:
            if offered:
                with self._lock:
                    self._taking -= 1
        if lease is None:
            return None
        with self._lock:
            previous = self._held.get(name)
            self._held[name] = _Held(lease, asked)
            self._offered.discard(name)
        if previous is None or previous.lease.epoch != lease.epoch:
            log.info("%s: now owned by this instance (epoch %d)", name, lease.epoch)
        return Fence(self, name)

    def offer_if_over_share(self) -> bool:
        """Reserve one more offer if this instance is above its fair share (atomic: units
        deciding at once offer no more than the excess between them)."""
        with self._lock:
            held = sum(1 for n, h in self._held.items() if not h.lost and n != self.me)
            if held - len(self._offered) - self._reserved <= self.fair_share():
                return False
            self._reserved += 1
            return True

    def offer(self, name: str, *, reserved: bool = False) -> None:
        """Offer `name` to an instance under its share; this one runs it until taken.
        `reserved`: an offer reserved by `offer_if_over_share`."""
        try:
            held = self.held(name)
            if held is None or held.lost:
                return
            leases.offer(self.store, held.lease, ttl_s=self.ttl_s)
            with self._lock:
                first = name not in self._offered
                self._offered.add(name)
        finally:
            if reserved:
                with self._lock:
                    self._reserved -= 1
        if first:
            log.info("%s: offered to share the work (%d held)", name, len(self.held_names()))

    def withdraw(self, name: str) -> None:
        """No longer offer `name` (this instance is no longer above its share)."""
        with self._lock:
            if name not in self._offered:
                return
            self._offered.discard(name)
        held = self.held(name)
        if held is not None:
            leases.withdraw(self.store, held.lease)

    def renew_all(self) -> list[str]:
        """Renew every lease held (and this instance's own); return the names lost."""
        with self._lock:
            held = dict(self._held)
        lost = []
        failed = False
        for name, h in held.items():
            if h.lost:
                continue
            asked = self.clock()
            try:
                renewed = leases.renew(self.store, h.lease, ttl_s=self.ttl_s, revive=True)
            except StoreError as exc:
                # Not lost: nobody can take it while the store is away (see `Fence.valid`).
                if self._away_mono is None:
                    began = self.store.health.unreachable_mono
                    self._went_away(asked if began is None else min(began, asked))
                    log.warning(
                        "%s: lease not renewed (%s): kept while the store is away", name, exc
                    )
                failed = True
                continue
            with self._lock:
                now_held = self._held.get(name)
                if now_held is None or now_held.lease.epoch != h.lease.epoch:
                    continue  # given up (or taken back) meanwhile by the unit's loop
                if renewed is None:
                    now_held.lost = True
                    lost.append(name)
                else:
                    self._held[name] = _Held(renewed, asked)
        if not failed and self._away_mono is not None and self.store.reachable:
            self._away_mono = None
            self._back_mono = self.clock()
            log.warning("leases: renewed after the store came back (%d held)", len(held))
        for name in lost:
            with self._lock:
                self._offered.discard(name)
            log.warning("%s: lease lost (taken over or expired): this instance stops it", name)
        return lost

    def heartbeat(self) -> None:
        """Hold this instance's own lease, count the live instances, and mark that this
        one holds no write for the store when it holds none (`replag.store.held_marks`:
        after an outage the evaluator of alerts waits for that mark from every instance
        live when the store went away)."""
        own = self.held(self.me)
        if own is None or own.lost or not Fence(self, self.me).valid():
            self.try_acquire(self.me)
        asked = self.clock()
        current = leases.current(self.store)
        live = {x.holder for x in current if x.name.startswith(INSTANCE_PREFIX)}
        owners: dict[str, list[str]] = {holder: [] for holder in live}
        for lease in current:
            if not lease.name.startswith((INSTANCE_PREFIX, OFFER_PREFIX)):
                owners.setdefault(lease.holder, []).append(lease.name)
        self.owners = owners
        self.live_instances = max(1, len(live))
        self._live_seen = (asked, frozenset(live))
        if held_marks.nothing_held(self.store):
            asked = self.clock()
            try:
                held_marks.mark_nothing_held(self.store, self.holder)
            except StoreError as exc:
                log.debug("nothing held: not marked (%s)", exc)
            else:
                self._marked_mono = asked

    def mark_lost(self, name: str) -> None:
        with self._lock:
            if name in self._held:
                self._held[name].lost = True

    def forget(self, name: str) -> None:
        with self._lock:
            self._held.pop(name, None)
            self._offered.discard(name)

    def release(self, name: str) -> None:
        """Give `name` up now, so another instance may take it at once."""
        with self._lock:
            held = self._held.pop(name, None)
            self._offered.discard(name)
        if held is not None and not held.lost:
            try:
                leases.release(self.store, held.lease)
            except StoreError as exc:
                log.warning("%s: lease not released (%s); it expires by itself", name, exc)

    def release_all(self) -> None:
        with self._lock:
            names = list(self._held)
        for name in names:
            self.release(name)
        try:
            held_marks.forget(self.store, self.holder)
        except StoreError as exc:
            log.debug("held writes mark not removed (%s)", exc)
