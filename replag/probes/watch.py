"""One probe run's keys watched arriving on a region's replicas, from inside the region.

This is a region agent's half of lag through agents. Before writing, the prober
names the run's keys (a stem and a count); `ArrivalWatch` opens the observers
the prober itself would (`open_observer`: push where the replica publishes
keyspace events, poll otherwise) on every replica's local address, so each
arrival is stamped one local hop from the replica instead of a WAN hop, with
the same bracket arithmetic. The prober's monotonic clock means nothing here,
so arrivals leave on this host's wall clock: each bracket is mapped from the
monotonic clock with the mapping read when reported, and widened by how far
that mapping moved since the watch began (an NTP slew) plus the reads' own
uncertainty. `WatchBook` holds the watches an agent serves and ends each one
its own `timeout_s` after it began, so a prober that vanished leaks nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from replag.background import cancel_and_wait
from replag.clockbound import WallClock
from replag.errors import ReplagError, UsageError
from replag.probes.observers import Observer, open_observer
from replag.settings import PROBE_MODES, Settings
from replag.topology import Endpoint
from replag.wire.resp import RespConnection

log = logging.getLogger(__name__)
MAX_KEYS = 100_000


@dataclass(frozen=True, kw_only=True)
class WatchSpec:
    """What the prober asks: keys `stem` + 0 … count−1, matched by `pattern`."""

    run_id: str
    stem: bytes
    count: int
    pattern: bytes
    mode: str = "auto"
    timeout_s: float = 30.0

    def check(self, prefix: str) -> None:
        """UsageError unless this names probe keys under `prefix` only."""
        wanted = prefix.encode()
        if not self.stem.startswith(wanted) or not self.pattern.startswith(wanted):
            raise UsageError(f"stem and pattern must start with the probe prefix {prefix!r}")
        if not 0 < self.count <= MAX_KEYS:
            raise UsageError(f"count: 1 to {MAX_KEYS} keys")
        if self.mode not in PROBE_MODES:
            raise UsageError(f"mode: one of {', '.join(PROBE_MODES)}")
        if not 0 < self.timeout_s <= 3600:
            raise UsageError("timeout_s: above 0, at most 3600")

    def keys(self) -> list[bytes]:
        return [self.stem + str(seq).encode() for seq in range(self.count)]


@dataclass
class _Replica:
    endpoint: Endpoint
    conn: RespConnection | None = None
    observer: Observer | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


class ArrivalWatch:
    """The observers of one run on this region's replicas (each at its local address)."""

    def __init__(
        self,
        spec: WatchSpec,
        replicas: Sequence[Endpoint],
        settings: Settings,
        *,
        clock: WallClock,
        watch_id: str | None = None,
    ) -> None:
        self.spec, self.settings, self.clock = spec, settings, clock
        self.id = watch_id or uuid.uuid4().hex[:12]
        self.replicas = [_Replica(endpoint=ep.in_region()) for ep in replicas]
        self._seq = {key: seq for seq, key in enumerate(spec.keys())}
        self.started_mono_ns = time.monotonic_ns()
        self._mapping = clock.wall_minus_monotonic()

    async def start(self) -> None:
        """Open every replica's observer; a replica that fails is reported, not raised."""
        await asyncio.gather(*(self._open(r) for r in self.replicas))

    async def _open(self, replica: _Replica) -> None:
        ep = replica.endpoint
        try:
            replica.conn = await RespConnection.open(
                ep, timeout_s=self.settings.connect_timeout, clock=time.monotonic_ns
            )
            replica.observer = await open_observer(
                ep,
                replica.conn,
                pattern=self.spec.pattern,
                mode=self.spec.mode,
                poll_interval_s=self.settings.poll_interval,
                timeout_s=self.settings.connect_timeout,
                notes=replica.notes,
                subscribe=self.settings.prefix.encode() + b"*",
                may_configure=self.settings.allow_config_changes,
                declared=self.settings.notify_keyspace_events,
            )
        except ReplagError as exc:
            replica.error = str(exc)
            return
        # The writes come after this moment: a valid lower bound until a poll misses a key.
        now = time.monotonic_ns()
        for key in self._seq:
            replica.observer.expect(key, now)
        await replica.observer.start()

    def complete(self) -> bool:
        """Every replica that can be watched has seen every key."""
        return all(
            r.observer is None or r.observer.error is not None or self._seen(r) >= self.spec.count
            for r in self.replicas
        )

    def _seen(self, replica: _Replica) -> int:
        assert replica.observer is not None
        return sum(1 for key in replica.observer.arrivals if key in self._seq)

    async def wait(self, wait_s: float) -> None:
        """Until complete, or `wait_s` (a long poll: the prober asks once, across the WAN)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.complete():
                return
            # Observers fill their arrivals from socket callbacks; there is no event to wait on.
            await asyncio.sleep(0.002)

    def report(self) -> dict[str, Any]:
        """Arrivals on this host's wall clock: per replica `[seq, estimate, lo, hi]`, ns
        relative to `base_ns` (wall-clock integers lose precision in JSON elsewhere)."""
        mapping, read_unc = self.clock.wall_minus_monotonic()
        start_mapping, start_unc = self._mapping
        widen = abs(mapping - start_mapping) + read_unc + start_unc
        base = self.started_mono_ns + mapping
        replicas = []
        for r in self.replicas:
            rows: list[list[int]] = []
            merged: list[int] = []
            prompt: list[int] = []
            loop: list[int] = []
            widened: list[list[int]] = []
            if r.observer is not None:
                r.observer.settle()
                for key, arrival in r.observer.arrivals.items():
                    seq = self._seq.get(key)
                    if seq is None:
                        continue
                    if arrival.merged:
                        merged.append(seq)
                    if arrival.prompt:
                        prompt.append(seq)
                    if not arrival.kernel:
                        loop.append(seq)
                    if arrival.widened_ns:
                        widened.append([seq, arrival.widened_ns])
                    rows.append(
                        [
                            seq,
                            arrival.estimate_ns + mapping - base,
                            arrival.lo_ns + mapping - base - widen,
                            arrival.hi_ns + mapping - base + widen,
                        ]
                    )
            rows.sort()
            replicas.append(
                {
                    "name": r.endpoint.name,
                    "observed_by": r.observer.mode if r.observer is not None else None,
                    "error": r.error or (r.observer.error if r.observer is not None else None),
                    "notes": r.notes,
                    "arrivals": rows,
                    # Arrivals read together with later ones: only bracketed (a field of
                    # its own, so a prober that predates it still reads the rows).
                    "merged": sorted(merged),
                    # Of those, the ones read at once (`Arrival.prompt`).
                    "prompt": sorted(prompt),
                    # Stamped when read, not by the kernel (`Arrival.kernel`), and the bars
                    # widened by the agent's own wait for a CPU: [seq, ns] (already in lo).
                    "loop": sorted(loop),
                    "widened": sorted(widened),
                }
            )
        return {
            "watch": self.id,
            "run_id": self.spec.run_id,
            "complete": self.complete(),
            "base_ns": base,
            "replicas": replicas,
        }

    async def stop(self) -> None:
        for r in self.replicas:
            if r.observer is not None:
                await r.observer.stop()
            if r.conn is not None:
                await r.conn.close()


class WatchBook:
    """The watches one agent serves; each ends itself `spec.timeout_s` after it began."""

    def __init__(
        self,
        replicas: Sequence[Endpoint],
        settings: Settings,
        *,
        clock: WallClock,
        max_watches: int = 64,
    ) -> None:
        self.replicas, self.settings, self.clock = list(replicas), settings, clock
        self.max_watches = max_watches
        self.watches: dict[str, ArrivalWatch] = {}
        self._reapers: dict[str, asyncio.Task[None]] = {}
        self.opened = 0
        self.expired = 0

    async def open(self, spec: WatchSpec) -> ArrivalWatch:
        spec.check(self.settings.prefix)
        if len(self.watches) >= self.max_watches:
            raise UsageError(f"{self.max_watches} watches already open; try again later")
        watch = ArrivalWatch(spec, self.replicas, self.settings, clock=self.clock)
        self.watches[watch.id] = watch
        self._reapers[watch.id] = asyncio.create_task(self._reap(watch.id, spec.timeout_s))
        self.opened += 1
        try:
            await watch.start()
        except BaseException:
            await self.close(watch.id)
            raise
        return watch

    def get(self, watch_id: str) -> ArrivalWatch:
        try:
            return self.watches[watch_id]
        except KeyError:
            raise UsageError(f"no watch {watch_id!r} (ended, or never opened)") from None

    async def _reap(self, watch_id: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        watch = self.watches.pop(watch_id, None)
        self._reapers.pop(watch_id, None)
        if watch is not None:
            self.expired += 1
            log.info("lag watch %s (run %s) ended by its timeout", watch_id, watch.spec.run_id)
            await watch.stop()

    async def close(self, watch_id: str) -> None:
        watch = self.watches.pop(watch_id, None)
        reaper = self._reapers.pop(watch_id, None)
        if reaper is not None and reaper is not asyncio.current_task():
            await cancel_and_wait(reaper)
        if watch is not None:
            await watch.stop()

    async def close_all(self) -> None:
        for watch_id in list(self.watches):
            await self.close(watch_id)
