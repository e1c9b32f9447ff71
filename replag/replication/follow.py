"""Following a Sentinel failover: which primary a region writes to now, and what changed.

Before each probe run of a region with `sentinel`, the Sentinels are asked
where the master is (one command) and that server must answer `role:master`.
If it is not the primary this region last wrote to (the store remembers it;
without a store, the config's write endpoint), a failover happened: it is
reported as an event with the bytes it lost and the lag around it. Bytes
lost: the promoted replica took over at offset `second_repl_offset − 1` of
the old history (`master_replid2`); whatever the old primary held beyond that
is gone — at least its last offset replag saw (the previous sample) minus that,
more if the old primary is still up and wrote on. If the Sentinels cannot be
reached, the last known primary is used as long as it still answers as one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from replag.errors import DiscoveryError, EndpointError, ReplagError, UnreachableError
from replag.replication.history import WritePrimary, remember_write_primary, write_primary
from replag.replication.info import ReplicationInfo
from replag.replication.sentinel import master_address, sentinel_call
from replag.store import Store
from replag.topology import Endpoint, Region, Topology
from replag.wire.reach import Reach


@dataclass(kw_only=True)
class FailoverEvent:
    """A failover the probe followed: the old and new primary, what was lost, the lag around it."""

    source: str
    master: str  # the Sentinel master's name, or the Redis Cluster shard's identity
    old_primary: str
    new_primary: str
    new_primary_name: str
    detected_ns: int
    promoted_at_offset: int | None = None
    old_last_offset: int | None = None
    bytes_lost: int | None = None
    lag_before_ms: float | None = None
    lag_after_ms: float | None = None
    notes: list[str] = field(default_factory=list)
    kind: str = "sentinel"  # sentinel | cluster: who promoted the new primary

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kind": self.kind,
            "master": self.master,
            "old_primary": self.old_primary,
            "new_primary": self.new_primary,
            "new_primary_name": self.new_primary_name,
            "detected_ns": self.detected_ns,
            "detected": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.detected_ns / 1e9)),
            "promoted_at_offset": self.promoted_at_offset,
            "old_last_offset": self.old_last_offset,
            "bytes_lost": self.bytes_lost,
            "lag_before_ms": self.lag_before_ms,
            "lag_after_ms": self.lag_after_ms,
            "notes": self.notes,
        }

    def render(self) -> str:
        lost = "unknown" if self.bytes_lost is None else f"at least {self.bytes_lost}"
        lag = ", ".join(
            f"{label} {value:.1f} ms"
            for label, value in (("before", self.lag_before_ms), ("after", self.lag_after_ms))
            if value is not None
        )
        what = f"Sentinel master {self.master}" if self.kind == "sentinel" else "Redis Cluster"
        return (
            f"FAILOVER: {self.source} ({what}): primary "
            f"{self.old_primary} → {self.new_primary} ({self.new_primary_name}); bytes lost "
            f"{lost}" + (f"; p99 lag {lag}" if lag else "")
        )


@dataclass(kw_only=True)
class WriteResolution:
    endpoint: Endpoint
    info: ReplicationInfo | None = None
    event: FailoverEvent | None = None
    notes: list[str] = field(default_factory=list)


async def read_info(endpoint: Endpoint, *, timeout_s: float) -> ReplicationInfo:
    """INFO replication of one server (EndpointError if it cannot be read)."""
    text = await sentinel_call(endpoint, "INFO", "replication", timeout_s=timeout_s)
    return ReplicationInfo.parse(text, where=endpoint.name)


def home(endpoint: Endpoint) -> str:
    """host:port as the server's own region (and Sentinel) knows it."""
    return endpoint.in_region().address


def endpoint_at(
    topology: Topology, region: Region, host: str, port: int, *, named_by: str = "the store"
) -> Endpoint:
    """The configured endpoint at host:port (its name and credentials), else one like
    the region's write endpoint at that address if `Reach` admits it (OutsideReach, saying
    that `named_by` named it, if not: it gets neither the credentials nor the writes)."""
    for r in topology.observed_from(region):
        for ep in ((r.write,) if r.write else ()) + r.replicas:
            # Sentinel names servers as their region sees them (`local`, if configured).
            if (host, port) in ((ep.host, ep.port), ep.local):
                return replace(ep, region=region.name)
    assert region.write is not None
    found = replace(region.write, name=f"{region.name}-primary@{host}:{port}", host=host, port=port)
    return Reach.of(topology).admit(
        found, named_by=named_by, as_what=f"the primary of region {region.name}"
    )


def _sentinels_of(region: Region) -> str:
    assert region.sentinel is not None
    return f"Sentinels of region {region.name} (master {region.sentinel.master})"


async def sentinel_primary(
    topology: Topology, region: Region, *, timeout_s: float
) -> tuple[Endpoint, list[str]]:
    """Where `region`'s Sentinels say its master is now, read-only (nothing is recorded):
    the configured endpoint there, and notes. The config's write endpoint, with a note,
    when no Sentinel answers; DiscoveryError when they know no such master."""
    ref = region.sentinel
    assert ref is not None and region.write is not None
    try:
        found = await master_address(ref.sentinels, ref.master, timeout_s=timeout_s)
    except UnreachableError as exc:
        return region.write, [
            f"{region.name}: Sentinels unreachable ({exc.message}); checking the configured "
            f"primary {region.write.address}"
        ]
    if found is None:
        raise DiscoveryError(
            f"the Sentinels do not know a master named {ref.master!r}",
            where=f"region {region.name}",
        )
    endpoint = endpoint_at(topology, region, *found, named_by=_sentinels_of(region))
    notes = []
    if home(endpoint) != home(region.write):
        notes.append(
            f"{region.name}: primary resolved through Sentinel: {endpoint.name} "
            f"({home(endpoint)}); the config names {home(region.write)}"
        )
    return endpoint, notes


async def resolve_write(
    topology: Topology,
    region: Region,
    *,
    timeout_s: float,
    store: Store | None,
    lag_p99_ms: dict[str, float] | None = None,
) -> WriteResolution:
    """The primary `region` writes to now (through its Sentinels), and a failover event if
    it is not the one last written to."""
    ref = region.sentinel
    assert ref is not None and region.write is not None
    known, known_address = last_primary(store, region)
    notes: list[str] = []
    try:
        found = await master_address(ref.sentinels, ref.master, timeout_s=timeout_s)
    except UnreachableError as exc:
        host, _, port = known_address.rpartition(":")
        endpoint = endpoint_at(topology, region, host, int(port))
        notes.append(f"Sentinels unreachable ({exc.message}); writing to {endpoint.address}")
        info = await _primary_info(endpoint, timeout_s=timeout_s, why="last known primary")
        return WriteResolution(endpoint=endpoint, info=info, notes=notes)
    if found is None:
        raise DiscoveryError(
            f"the Sentinels do not know a master named {ref.master!r}",
            where=f"region {region.name}",
        )
    endpoint = endpoint_at(topology, region, *found, named_by=_sentinels_of(region))
    info = await _primary_info(endpoint, timeout_s=timeout_s, why="primary named by Sentinel")
    resolution = WriteResolution(endpoint=endpoint, info=info, notes=notes)
    if home(endpoint) != home(region.write):
        notes.append(
            f"write endpoint resolved through Sentinel: {endpoint.name} ({home(endpoint)}); "
            f"the config names {home(region.write)}"
        )
    if home(endpoint) != known_address:
        resolution.event = await failover_event(
            topology,
            region,
            master=ref.master,
            known=known,
            old_address=known_address,
            endpoint=endpoint,
            info=info,
            timeout_s=timeout_s,
            lag_p99_ms=lag_p99_ms or {},
        )
    remember_primary(store, region, ref.master, endpoint, info)
    return resolution


def last_primary(store: Store | None, region: Region) -> tuple[WritePrimary | None, str]:
    """The primary `region` was last written to (the store's record, else the config's)
    and its address."""
    assert region.write is not None
    known = write_primary(store, region.name) if store is not None else None
    return known, known.address if known else home(region.write)


def remember_primary(
    store: Store | None, region: Region, master: str, endpoint: Endpoint, info: ReplicationInfo
) -> None:
    """Record the primary `region` now writes to and its offset, for the next run to compare
    with (the bytes a later failover loses are counted from it)."""
    if store is None:
        return
    remember_write_primary(
        store,
        WritePrimary(
            region=region.name,
            master=master,
            address=home(endpoint),
            replid=info.replid,
            offset=info.offset,
            updated_ns=time.time_ns(),
        ),
    )


async def _primary_info(endpoint: Endpoint, *, timeout_s: float, why: str) -> ReplicationInfo:
    try:
        info = await read_info(endpoint, timeout_s=timeout_s)
    except EndpointError:
        raise
    except ReplagError as exc:
        raise UnreachableError(exc.message, where=f"{why} {endpoint.address}") from None
    if not info.is_primary:
        raise UnreachableError(
            f"role {info.role} (replicating from {info.master_address}), not a primary: "
            "a failover in progress?",
            where=f"{why} {endpoint.address}",
        )
    return info


async def failover_event(
    topology: Topology,
    region: Region,
    *,
    master: str,
    known: WritePrimary | None,
    old_address: str,
    endpoint: Endpoint,
    info: ReplicationInfo,
    timeout_s: float,
    lag_p99_ms: dict[str, float],
    kind: str = "sentinel",
) -> FailoverEvent:
    """The failover of `region` from `old_address` to `endpoint` (a Sentinel master's, or
    a Redis Cluster shard's: `master` names it), with the bytes it lost."""
    event = FailoverEvent(
        source=region.name,
        kind=kind,
        master=master,
        old_primary=old_address,
        new_primary=home(endpoint),
        new_primary_name=endpoint.name,
        detected_ns=time.time_ns(),
        lag_before_ms=lag_p99_ms.get(endpoint.name),
    )
    old_replid = known.replid if known else None
    old_offset = known.offset if known else None
    # The old primary, if it is still up as a primary (a partition), may have written on.
    host, _, port = old_address.rpartition(":")
    old = endpoint_at(topology, region, host, int(port))
    try:
        old_info = await read_info(old, timeout_s=timeout_s)
    except ReplagError:
        old_info = None
    if old_info is not None and old_info.is_primary:
        event.notes.append(f"the old primary {old_address} still answers as a primary")
        if old_replid in (None, old_info.replid):
            old_replid = old_info.replid
            old_offset = max(old_offset or 0, old_info.offset)
    if info.second_replid_offset is not None and info.second_replid_offset > 0:
        event.promoted_at_offset = info.second_replid_offset - 1
    if old_offset is None or old_replid is None:
        event.notes.append("no offset of the old primary on record: bytes lost unknown")
    elif info.replid2 != old_replid or event.promoted_at_offset is None:
        event.notes.append(
            "the new primary does not continue the old primary's history "
            "(its replica resynced fully first): bytes lost unknown"
        )
    else:
        event.old_last_offset = old_offset
        event.bytes_lost = max(0, old_offset - event.promoted_at_offset)
    return event
