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
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from replag.errors import LeaseLost, StoreError
from replag.store import Store, Transaction, leases
from replag.store.leases import Lease

log = logging.getLogger("replag.service")

INSTANCE_PREFIX = "instance:"
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
        return self.keeper.clock() < held.confirmed_mono + self.keeper.ttl_s * _SAFE_FRACTION

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

    def may_take_more(self) -> bool:
        return len(self.held_names()) < self.fair_share()

    def over_share(self) -> bool:
        return len(self.held_names()) > self.fair_share()

    # --- store round trips (blocking) --------------------------------------------------

    def try_acquire(self, name: str) -> Fence | None:
        """Take `name` if it is free or expired; None when another instance holds it."""
        asked = self.clock()
        lease = leases.acquire(self.store, name, holder=self.holder, ttl_s=self.ttl_s)
        if lease is None:
            return None
        with self._lock:
            previous = self._held.get(name)
            self._held[name] = _Held(lease, asked)
        if previous is None or previous.lease.epoch != lease.epoch:
            log.info("%s: now owned by this instance (epoch %d)", name, lease.epoch)
        return Fence(self, name)

    def renew_all(self) -> list[str]:
        """Renew every lease held (and this instance's own); return the names lost."""
        with self._lock:
            held = dict(self._held)
        lost = []
        for name, h in held.items():
            if h.lost:
                continue
            asked = self.clock()
            try:
                renewed = leases.renew(self.store, h.lease, ttl_s=self.ttl_s)
            except StoreError as exc:
                # Not lost yet: the local deadline runs out by itself if the store stays away.
                log.warning("%s: lease not renewed (%s)", name, exc)
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
        for name in lost:
            log.warning("%s: lease lost (taken over or expired): this instance stops it", name)
        return lost

    def heartbeat(self) -> None:
        """Hold this instance's own lease and count the live instances."""
        own = self.held(self.me)
        if own is None or own.lost or not Fence(self, self.me).valid():
            self.try_acquire(self.me)
        self.live_instances = max(1, len(leases.current(self.store, prefix=INSTANCE_PREFIX)))

    def mark_lost(self, name: str) -> None:
        with self._lock:
            if name in self._held:
                self._held[name].lost = True

    def forget(self, name: str) -> None:
        with self._lock:
            self._held.pop(name, None)

    def release(self, name: str) -> None:
        """Give `name` up now, so another instance may take it at once."""
        with self._lock:
            held = self._held.pop(name, None)
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
