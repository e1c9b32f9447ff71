"""Following a Redis Cluster shard between probe runs: where its primary is and which slots
it holds now.

Before each probe run of a shard's region, `CLUSTER SHARDS` (or `CLUSTER SLOTS`)
is read from the first node of the cluster that answers (the region's own
nodes first, then the other shards'), and the region's shard is found by its
identity (`shard` in the config: a shard id or a node id of it; a file without
one, by the addresses of its nodes). The run then writes to the shard's
current primary, into a slot it holds now, and observes its current replicas:
a failover and a reshard are followed without a new discovery. When the
primary is not the one the region last wrote to (the store remembers it; the
config's `write` the first time), the failover is reported as an event with
the bytes it lost, as for Sentinel. One command per run.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from replag.discovery.cluster import ClusterNode, Shard, read_shards
from replag.errors import (
    DiscoveryError,
    EndpointError,
    OutsideReach,
    ReplagError,
    UnreachableError,
)
from replag.replication.check import recent_lag_p99_ms
from replag.replication.follow import (
    FailoverEvent,
    failover_event,
    home,
    last_primary,
    read_info,
    remember_primary,
)
from replag.store import Store
from replag.topology import Endpoint, Region, Topology
from replag.wire.reach import Reach

_LAG_FRESHNESS_S = 300.0  # probe figures older than this say nothing about the lag now


@dataclass(kw_only=True)
class ShardNow:
    """The region as the cluster has it now (write, replicas, slots), and what changed."""

    region: Region
    event: FailoverEvent | None = None
    notes: list[str] = field(default_factory=list)
    identity: str = ""  # the shard's (see Shard.identity)
    seen_by: str = ""  # the node whose CLUSTER SHARDS said so


def is_cluster_shard(region: Region) -> bool:
    return bool(region.slots or region.shard)


def _seeds(topology: Topology, region: Region) -> list[Endpoint]:
    """Nodes to ask: the region's own (write first), then the other shards' nodes."""
    own = [*((region.write,) if region.write else ()), *region.replicas]
    others = [
        ep
        for r in topology.regions
        if r is not region and is_cluster_shard(r) and r.cluster == region.cluster
        for ep in ((r.write,) if r.write else ()) + r.replicas
    ]
    seen: set[tuple[str, int]] = set()
    out = []
    for ep in own + others:
        if (ep.host, ep.port) not in seen:
            seen.add((ep.host, ep.port))
            out.append(ep)
    return out


async def read_cluster(
    topology: Topology, region: Region, *, timeout_s: float
) -> tuple[list[Shard], Endpoint]:
    """The shards as the first answering node sees them, and that node."""
    failures = []
    for seed in _seeds(topology, region):
        try:
            shards, _, _ = await read_shards(seed, timeout_s=timeout_s)
        except EndpointError as exc:
            failures.append(f"{seed.address}: {exc.message}")
            continue
        return shards, seed
    raise UnreachableError(
        "no node of the cluster answered CLUSTER SHARDS: " + "; ".join(failures),
        where=f"region {region.name}",
    )


def _endpoint(topology: Topology, region: Region, node: ClusterNode, seen_by: str) -> Endpoint:
    """The configured endpoint at the node's address (its name, credentials), else one like
    the region's write endpoint there, named host:port as discovery names them."""
    for ep in topology.endpoints():
        if (node.host, node.port) in ((ep.host, ep.port), ep.local):
            return dataclasses.replace(ep, region=region.name)
    assert region.write is not None
    found = dataclasses.replace(
        region.write, name=f"{node.host}:{node.port}", host=node.host, port=node.port, local=None
    )
    return Reach.of(topology).admit(
        found, named_by=f"CLUSTER SHARDS of {seen_by}", as_what=f"a node of region {region.name}"
    )


def find_shard(region: Region, shards: list[Shard]) -> Shard | None:
    """The region's shard: by identity, else by the addresses of its configured nodes."""
    if region.shard:
        found = next((s for s in shards if s.holds(region.shard)), None)
        if found is not None:
            return found
    addresses = {
        (ep.host, ep.port) for ep in ((region.write,) if region.write else ()) + region.replicas
    }
    addresses |= {ep.local for ep in region.replicas if ep.local}
    return next(
        (s for s in shards if any((n.host, n.port) in addresses for n in s.nodes)),
        None,
    )


async def current_shard(topology: Topology, region: Region, *, timeout_s: float) -> ShardNow:
    """`region` with its shard's current primary, replicas and slots, as the first node that
    answers sees them; read only (EndpointError when no node of the cluster answers,
    DiscoveryError when the shard is gone). `failover-check` asks this; a probe run
    `follow_shard`, which also reports and remembers a primary change."""
    assert region.write is not None
    shards, seed = await read_cluster(topology, region, timeout_s=timeout_s)
    shard = find_shard(region, shards)
    if shard is None:
        raise DiscoveryError(
            f"the cluster (as {seed.address} sees it) has no shard "
            f"{region.shard or 'with the nodes of ' + region.name} holding slots",
            where=f"region {region.name}",
        )
    write = _endpoint(topology, region, shard.primary, seed.address)
    replicas, outside = [], []
    for node in shard.replicas:
        try:
            replicas.append(_endpoint(topology, region, node, seed.address))
        except OutsideReach as exc:
            outside.append(str(exc))
    # A configured node the cluster lists in no shard now (a failed old primary) is still
    # one of the shard's servers: observed, and reported while it does not answer.
    listed = {(n.host, n.port) for s in shards for n in s.nodes}
    gone = [
        ep
        for ep in ((region.write,) if region.write else ()) + region.replicas
        if (ep.host, ep.port) not in listed and (ep.local or ()) not in listed
    ]
    now = ShardNow(
        region=dataclasses.replace(
            region, write=write, replicas=(*replicas, *gone), slots=shard.slots
        ),
        identity=shard.identity,
        seen_by=seed.address,
    )
    for ep in gone:
        now.notes.append(f"{ep.name} ({ep.address}) is in no shard of the cluster now")
    now.notes += outside
    if shard.slots != region.slots:
        ranges = ", ".join(f"{a}-{b}" for a, b in shard.slots)
        now.notes.append(f"{region.name} holds slots {ranges} now (the config lists others)")
    return now


async def follow_shard(
    topology: Topology, region: Region, *, timeout_s: float, store: Store | None
) -> ShardNow:
    """`current_shard`, and a primary other than the one the region last wrote to (the
    store remembers it; the config's the first time) as a failover event, remembered."""
    assert region.write is not None
    now = await current_shard(topology, region, timeout_s=timeout_s)
    write = now.region.write
    assert write is not None
    known, known_address = last_primary(store, region)
    if home(write) == known_address:
        return now
    now.notes.append(
        f"{region.name}: primary {known_address} → {home(write)} (from CLUSTER SHARDS of "
        f"{now.seen_by})"
    )
    try:
        info = await read_info(write, timeout_s=timeout_s)
    except ReplagError as exc:
        raise UnreachableError(exc.message, where=f"new primary {write.address}") from None
    now.event = await failover_event(
        topology,
        region,
        kind="cluster",
        master=now.identity,
        known=known,
        old_address=known_address,
        endpoint=write,
        info=info,
        timeout_s=timeout_s,
        lag_p99_ms=recent_lag_p99_ms(
            store, region.name, now_ns=time.time_ns(), freshness_s=_LAG_FRESHNESS_S
        )
        if store is not None
        else {},
    )
    remember_primary(store, region, now.identity, write, info)
    return now
