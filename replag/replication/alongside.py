"""Replication state sampled alongside one probe run, and the Sentinel hand-off before it.

`ProbeReplication.open()` resolves the write endpoint (through Sentinel for a
region that has one, reporting a failover it finds); `sample_start()` and
`sample_end()` bracket the run (the write rate is taken across it, the state
reported is the end's, after the probe keys arrived); `finish()` puts both in
the report and `save()` in the store.
"""

from __future__ import annotations

import dataclasses
import time

from replag.replication import history
from replag.replication.check import recent_lag_p99_ms
from replag.replication.follow import FailoverEvent, resolve_write
from replag.replication.sampler import ReplicationSampler, SampleTarget, replication_targets
from replag.replication.state import ReplicationSnapshot
from replag.settings import Settings
from replag.store import Store
from replag.topology import Endpoint, Region, Topology

_LAG_FRESHNESS_S = 300.0


class ProbeReplication:
    def __init__(
        self,
        *,
        write_endpoint: Endpoint,
        targets: list[SampleTarget],
        notes: list[str],
        target_notes: list[str],
        sampler: ReplicationSampler,
        own_sampler: bool,
        event: FailoverEvent | None,
    ) -> None:
        self.write_endpoint = write_endpoint
        self.targets = targets
        self.notes = notes  # the Sentinel hand-off: for the run's notes
        self.target_notes = target_notes  # what is not sampled, and why: for the snapshot
        self.event = event
        self.snapshot: ReplicationSnapshot | None = None
        self.start_snapshot: ReplicationSnapshot | None = None
        self._sampler = sampler
        self._own = own_sampler
        self._cost_commands = 0
        self._cost_ns = 0
        self._down: dict[str, str] = {}  # replicas unreachable earlier in this run: left alone

    @classmethod
    async def open(
        cls,
        topology: Topology,
        region: Region,
        *,
        settings: Settings,
        store: Store | None,
        sampler: ReplicationSampler | None = None,
    ) -> ProbeReplication:
        """Resolve `region`'s write endpoint; EndpointError if no primary can be written to."""
        assert region.write is not None
        write, notes, event = region.write, [], None
        if region.sentinel is not None:
            lag = (
                recent_lag_p99_ms(
                    store, region.name, now_ns=time.time_ns(), freshness_s=_LAG_FRESHNESS_S
                )
                if store is not None
                else {}
            )
            resolution = await resolve_write(
                topology,
                region,
                timeout_s=settings.connect_timeout,
                store=store,
                lag_p99_ms=lag,
            )
            write, notes, event = resolution.endpoint, resolution.notes, resolution.event
        targets, target_notes = replication_targets(
            topology, sources=[dataclasses.replace(region, write=write)]
        )
        return cls(
            write_endpoint=write,
            targets=targets,
            notes=notes,
            target_notes=target_notes,
            sampler=sampler or ReplicationSampler(timeout_s=settings.connect_timeout),
            own_sampler=sampler is None,
            event=event,
        )

    async def sample_start(self, down: dict[str, str] | None = None) -> None:
        """The baseline of the write rate (and a warm connection to every server); servers
        in `down` (name → error: unreachable earlier in this run) are not contacted again."""
        self._down = dict(down or {})
        if self.targets:
            first = await self._sampler.sample(self.targets, skip=self._down)
            self._down |= self._sampler.down
            self._cost_commands += first.commands
            self._cost_ns += first.duration_ns
            self.start_snapshot = first

    async def sample_end(self) -> None:
        """The state reported for this run, read once the probe keys have arrived."""
        snapshot = (
            await self._sampler.sample(self.targets, skip=self._down) if self.targets else None
        )
        snapshot = snapshot or ReplicationSnapshot()
        snapshot.commands += self._cost_commands
        snapshot.duration_ns += self._cost_ns
        snapshot.notes += self.target_notes
        self.snapshot = snapshot

    def syncing(self) -> tuple[set[str], set[str]]:
        """Replicas that were syncing with their primary (a full or initial resync, the
        snapshot's transfer and load) when the run started, and when it ended."""
        return _syncing(self.start_snapshot), _syncing(self.snapshot)

    def loading(self) -> set[str]:
        """Replicas found loading their dataset (among the syncing ones) at either end."""
        return _loading(self.start_snapshot) | _loading(self.snapshot)

    async def close(self) -> None:
        if self._own:
            await self._sampler.close()

    def finish(self, lag_p99_ms: dict[str, float]) -> None:
        """The failover event's lag after it: the worst p99 of this run."""
        if self.event is not None and lag_p99_ms:
            self.event.lag_after_ms = max(lag_p99_ms.values())

    def save(self, store: Store, region: Region) -> None:
        if self.snapshot is not None and self.snapshot.primaries:
            history.record_snapshot(store, self.snapshot)
            # Where a failover can move the primary (Sentinel, a Redis Cluster shard): the
            # primary written to and its offset, so the next failover's bytes lost are known.
            master = region.sentinel.master if region.sentinel else region.shard or region.name
            if region.sentinel is not None or region.slots:
                primary = self.snapshot.primaries[0]
                if primary.error is None:
                    history.remember_write_primary(
                        store,
                        history.WritePrimary(
                            region=region.name,
                            master=master,
                            address=self.write_endpoint.in_region().address,
                            replid=primary.replid,
                            offset=primary.offset,
                            updated_ns=primary.sampled_ns,
                        ),
                    )
        if self.event is not None:
            history.record_failover(store, self.event.to_dict())


def _syncing(snapshot: ReplicationSnapshot | None) -> set[str]:
    primaries = snapshot.primaries if snapshot is not None else []
    return {r.replica for p in primaries for r in p.replicas if r.status == "syncing"}


def _loading(snapshot: ReplicationSnapshot | None) -> set[str]:
    primaries = snapshot.primaries if snapshot is not None else []
    return {r.replica for p in primaries for r in p.replicas if r.loading}
