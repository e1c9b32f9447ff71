"""Discovery of a Redis Cluster's shards: CLUSTER SHARDS (Redis ≥ 7), else CLUSTER SLOTS.

Each shard (a primary holding slots, and its replicas) becomes a region that
probes write to through the primary, with its slot ranges so probe keys land
there, and a replica group that repair compares. A shard is named by what a
failover or a dead node leaves as it was, so its history survives them: the
shard id CLUSTER SHARDS gives (Valkey 8+, Redis 7.2+), `shard-<first 8 hex
digits>`, else its lowest slot, `shard-<slot>` (a node id would not do: a dead
old primary stands alone, slotless, after a failover, and the lowest of the
ids left is another). A reshard keeps names through the file being rewritten
(`kept_names`). The region's `shard` is its identity for following it: the
shard id, else its lowest node id. A database other than 0 holding keys on a
shard's primary (Valkey 9's `cluster-databases`) gets a group of its own, as in
replication discovery (`database_groups`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from replag.discovery.contacts import Contacts
from replag.discovery.deadline import Deadline
from replag.discovery.replication import database_groups, read_keyspace
from replag.discovery.result import Discovery
from replag.errors import DiscoveryError, EndpointError, UsageError
from replag.topology import Endpoint, Region, ReplicaGroup, Topology
from replag.wire import shapes
from replag.wire.connections import endpoint_errors
from replag.wire.connector import Connector
from replag.wire.reply_limits import DEFAULT as DEFAULT_LIMITS
from replag.wire.reply_limits import ReplyLimits

SLOT_COUNT = 16384


@dataclass(frozen=True, kw_only=True)
class ClusterNode:
    node_id: str
    host: str
    port: int
    health: str = "online"


@dataclass(frozen=True, kw_only=True)
class Shard:
    slots: tuple[tuple[int, int], ...]
    primary: ClusterNode
    replicas: tuple[ClusterNode, ...]
    shard_id: str | None = None  # CLUSTER SHARDS's `id` (Valkey 8+, Redis 7.2+)

    @property
    def identity(self) -> str:
        """What names the shard through failovers and reshards: its shard id, else the
        lowest node id of its nodes (the same nodes, whichever is primary)."""
        ids = [n.node_id for n in (self.primary, *self.replicas) if n.node_id]
        return self.shard_id or min(ids, default=f"{self.primary.host}:{self.primary.port}")

    @property
    def name(self) -> str:
        """`shard-<8 hex digits>` of its shard id, else `shard-<its lowest slot>`."""
        if self.shard_id:
            return f"shard-{self.shard_id[:8]}"
        if self.slots:
            return f"shard-{min(first for first, _ in self.slots)}"
        return f"shard-{self.identity[:8]}"

    def holds(self, identity: str) -> bool:
        """Whether `identity` (a shard id or a node id) is this shard's."""
        return identity in (self.shard_id, *(n.node_id for n in (self.primary, *self.replicas)))

    @property
    def nodes(self) -> tuple[ClusterNode, ...]:
        return (self.primary, *self.replicas)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(value: Any, *, what: str, where: str) -> dict[str, Any]:
    """A RESP3 map, or RESP2's flat [key, value, …] list, as a dict with str keys."""
    if isinstance(value, dict):
        return {_text(k): v for k, v in value.items()}
    if isinstance(value, list) and len(value) % 2 == 0:
        return {_text(value[i]): value[i + 1] for i in range(0, len(value), 2)}
    raise DiscoveryError(f"CLUSTER SHARDS: cannot read {what}: {value!r}", where=where)


def _port(value: Any, *, what: str, where: str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = 0
    if not 0 < port < 65536:
        raise DiscoveryError(f"{what} has a bad port {value!r}", where=where)
    return port


def parse_cluster_shards(reply: Any, *, seed_host: str, where: str) -> list[Shard]:
    """Shards of a CLUSTER SHARDS reply; shards holding no slots are left out."""
    if not isinstance(reply, list):
        raise DiscoveryError(f"CLUSTER SHARDS answered {reply!r}", where=where)
    shards = []
    for i, raw in enumerate(reply):
        entry = _pairs(raw, what=f"shard {i}", where=where)
        bounds = [int(b) for b in entry.get("slots", [])]
        if len(bounds) % 2:
            raise DiscoveryError(f"shard {i} has an odd slot list {bounds!r}", where=where)
        slots = tuple((bounds[j], bounds[j + 1]) for j in range(0, len(bounds), 2))
        primary, replicas = None, []
        for raw_node in entry.get("nodes", []):
            node = _pairs(raw_node, what=f"a node of shard {i}", where=where)
            host = _text(node.get("ip") or node.get("endpoint") or "")
            cluster_node = ClusterNode(
                node_id=_text(node.get("id", "")),
                host=host if host not in ("", "?") else seed_host,
                port=_port(node.get("port"), what=f"a node of shard {i}", where=where),
                health=_text(node.get("health", "online")),
            )
            if _text(node.get("role")) == "master":
                primary = cluster_node
            else:
                replicas.append(cluster_node)
        if not slots:
            continue
        if primary is None:
            raise DiscoveryError(f"shard {i} (slots {slots[0]}…) has no primary", where=where)
        shard_id = _text(entry["id"]) if entry.get("id") else None
        shards.append(
            Shard(slots=slots, primary=primary, replicas=tuple(replicas), shard_id=shard_id)
        )
    return shards


def parse_cluster_slots(reply: Any, *, seed_host: str, where: str) -> list[Shard]:
    """Shards of a CLUSTER SLOTS reply: ranges grouped by the primary serving them."""
    if not isinstance(reply, list):
        raise DiscoveryError(f"CLUSTER SLOTS answered {reply!r}", where=where)
    by_primary: dict[str, tuple[ClusterNode, list[tuple[int, int]], list[ClusterNode]]] = {}
    for entry in reply:
        if not isinstance(entry, list) or len(entry) < 3:
            raise DiscoveryError(f"CLUSTER SLOTS: cannot read {entry!r}", where=where)
        nodes = [_slots_node(raw, seed_host=seed_host, where=where) for raw in entry[2:]]
        primary = nodes[0]
        _, ranges, replicas = by_primary.setdefault(primary.node_id, (primary, [], []))
        ranges.append((int(entry[0]), int(entry[1])))
        for node in nodes[1:]:
            if node.node_id not in {r.node_id for r in replicas}:
                replicas.append(node)
    return [
        Shard(slots=tuple(sorted(ranges)), primary=primary, replicas=tuple(replicas))
        for primary, ranges, replicas in by_primary.values()
    ]


def _slots_node(raw: Any, *, seed_host: str, where: str) -> ClusterNode:
    if not isinstance(raw, list) or len(raw) < 2:
        raise DiscoveryError(f"CLUSTER SLOTS: cannot read node {raw!r}", where=where)
    host = _text(raw[0])
    port = _port(raw[1], what=f"CLUSTER SLOTS node {raw!r}", where=where)
    node_id = _text(raw[2]) if len(raw) > 2 else f"{host}:{port}"
    return ClusterNode(
        node_id=node_id, host=host if host not in ("", "?") else seed_host, port=port
    )


async def read_shards(
    seed: Endpoint, *, timeout_s: float, contacts: Contacts | None = None
) -> tuple[list[Shard], str, str]:
    """(shards, the command that answered, cluster_state) as seen from `seed`."""
    if contacts is not None:
        await contacts.reach(seed)
    client = Connector(seed, timeout_s=timeout_s).client()
    where = seed.url()
    try:
        with endpoint_errors(seed, "CLUSTER INFO/SHARDS"):
            try:
                info = await _cluster(client, "INFO")
            except ResponseError as exc:
                if "cluster support disabled" in str(exc).lower():
                    raise DiscoveryError(
                        "not a Redis Cluster node (cluster support is disabled)", where=where
                    ) from None
                raise
            try:
                reply = await _cluster(client, "SHARDS")
                command = "CLUSTER SHARDS"
            except ResponseError as exc:
                if "unknown subcommand" not in str(exc).lower():
                    raise
                # Before Redis 7 there is no CLUSTER SHARDS; SLOTS says the same in another shape.
                reply = await _cluster(client, "SLOTS")
                command = "CLUSTER SLOTS"
    finally:
        await client.aclose()
    shapes.topology_nodes(seed, command, reply)
    state = _cluster_state(info)
    if command == "CLUSTER SHARDS":
        shards = parse_cluster_shards(reply, seed_host=seed.host, where=where)
    else:
        shards = parse_cluster_slots(reply, seed_host=seed.host, where=where)
    return shards, command, state


async def _cluster(client: aioredis.Redis, *args: str) -> Any:
    run: Callable[..., Awaitable[Any]] = client.execute_command  # untyped in redis-py
    return await run("CLUSTER", *args)


def _cluster_state(info: Any) -> str:
    if isinstance(info, dict):
        return _text(info.get("cluster_state", "unknown"))
    for line in _text(info).splitlines():
        key, _, value = line.partition(":")
        if key == "cluster_state":
            return value.strip()
    return "unknown"


Slots = tuple[tuple[int, int], ...]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EarlierShard:
    """A shard as an earlier discovery wrote it: its region's name, slots and `shard`."""

    name: str
    slots: Slots
    identity: str | None = None


async def discover_cluster(
    url: str,
    *,
    timeout_s: float,
    contacts: Contacts | None = None,
    previous: Sequence[EarlierShard] = (),
    name: str | None = None,
    limits: ReplyLimits = DEFAULT_LIMITS,
) -> Discovery:
    """Every shard of the Redis Cluster that the node at `url` belongs to. `previous`: the
    shards of an earlier discovery (the file being rewritten, or the config in use): a
    shard keeps the name of the one it is (see `kept_names`). `name`: the cluster's, which
    prefixes each shard's (`NAME-shard-…`) and is each region's `cluster`."""
    try:
        seed = replace(Endpoint.from_url(url), limits=limits)
    except ValueError as exc:
        raise UsageError(f"--cluster: {exc}") from None
    shards, command, state = await read_shards(seed, timeout_s=timeout_s, contacts=contacts)
    if contacts is not None and contacts.networks is not None:
        shards = [s for s in [await _inside(s, contacts) for s in shards] if s is not None]
    if not shards:
        raise DiscoveryError(f"{command} lists no shard holding slots", where=seed.url())
    # Every shard's primary asked at once, under discovery's one deadline.
    primaries = [_primary_endpoint(seed, s.primary) for s in shards]
    read = await Deadline(timeout_s).each(
        primaries,
        lambda primary: _databases(primary, timeout_s=timeout_s, contacts=contacts),
        where=Endpoint.url,
        errors=(EndpointError,),
    )
    databases: dict[str, dict[int, int]] = {}
    unread: list[str] = []
    for shard, primary, found in zip(shards, primaries, read, strict=True):
        if isinstance(found, dict):
            databases[shard.identity] = found
            continue
        unread.append(f"{primary.name} ({found})")
    found_topology = cluster_topology(
        shards,
        seed=seed,
        command=command,
        state=state,
        names=kept_names(shards, previous),
        cluster=name,
        databases=databases,
    )
    if not unread:
        return found_topology
    note = "INFO keyspace not read (databases but 0 not discovered) on: " + "; ".join(unread)
    logger.warning("INFO keyspace not read on %d of %d shard primaries (databases but 0 "
                   "not discovered; the file's header names them): %s",
                   len(unread), len(shards), unread[0])  # fmt: skip
    return replace(found_topology, header="\n".join([found_topology.header, note]))


async def _inside(shard: Shard, contacts: Contacts) -> Shard | None:
    """`shard` without its nodes outside --allow-networks (recorded as refused, for the
    file's header); None if its primary is outside."""
    if not await contacts.admits(shard.primary.host, shard.primary.port):
        for node in shard.replicas:
            await contacts.admits(node.host, node.port)
        return None
    kept = [n for n in shard.replicas if await contacts.admits(n.host, n.port)]
    return replace(shard, replicas=tuple(kept))


def _primary_endpoint(seed: Endpoint, node: ClusterNode) -> Endpoint:
    return replace(seed, host=node.host, port=node.port, name=f"{node.host}:{node.port}")


async def _databases(
    primary: Endpoint, *, timeout_s: float, contacts: Contacts | None
) -> dict[int, int]:
    """Database → keys (INFO keyspace) on a shard's primary: Valkey 9's cluster-databases
    lets a cluster hold keys beyond db 0."""
    if contacts is not None:
        await contacts.reach(primary)
    return await read_keyspace(primary, timeout_s=timeout_s)


def _slot_set(slots: Slots) -> set[int]:
    return {s for a, b in slots for s in range(a, b + 1)}


def kept_names(shards: Sequence[Shard], previous: Sequence[EarlierShard]) -> dict[str, str]:
    """Shard identity → its earlier name: the earlier shard whose identity (shard id, or a
    node id) it holds, which a reshard leaves; else the one that held most of its slots (at
    least half), which a failover and a dead node leave."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for shard in shards:
        same = [e.name for e in previous if e.identity and shard.holds(e.identity)]
        if same and same[0] not in taken:
            names[shard.identity] = same[0]
            taken.add(same[0])
    for shard in shards:
        if shard.identity in names:
            continue
        held = _slot_set(shard.slots)
        best, overlap = None, 0
        for earlier in previous:
            common = len(held & _slot_set(earlier.slots))
            if earlier.name not in taken and common > overlap:
                best, overlap = earlier.name, common
        if best is not None and 2 * overlap >= len(held):
            names[shard.identity] = best
            taken.add(best)
    return names


def cluster_topology(
    shards: Sequence[Shard],
    *,
    seed: Endpoint,
    command: str,
    state: str,
    names: Mapping[str, str] | None = None,
    cluster: str | None = None,
    databases: Mapping[str, Mapping[int, int]] | None = None,
) -> Discovery:
    """One region and one replica group per shard, in slot order (`names`: identity → a
    name kept from an earlier discovery; `cluster`: the cluster's name, prefixing the
    shards' names), and a group per other database holding keys on its primary
    (`databases`: identity → db → keys; Valkey 9 cluster-databases)."""
    names = names or {}
    regions, groups = [], []
    comments: dict[str, str] = {}
    endpoint_comments: dict[str, str] = {}

    def endpoint(node: ClusterNode, region: str) -> Endpoint:
        ep = replace(
            seed,
            name=f"{node.host}:{node.port}",
            host=node.host,
            port=node.port,
            region=region,
            rack=None,
            kind="redis",
        )
        return ep

    for shard in sorted(shards, key=lambda s: s.slots[0]):
        own = f"{cluster}-{shard.name}" if cluster else shard.name
        name = names.get(shard.identity, own)
        primary = endpoint(shard.primary, name)
        replicas = tuple(endpoint(node, name) for node in shard.replicas)
        endpoint_comments[primary.name] = f"primary, cluster node {shard.primary.node_id}"
        for node, ep in zip(shard.replicas, replicas, strict=True):
            health = "" if node.health == "online" else f"; health {node.health} at discovery"
            endpoint_comments[ep.name] = f"replica, cluster node {node.node_id}{health}"
        regions.append(
            Region(
                name=name,
                write=primary,
                replicas=replicas,
                slots=shard.slots,
                shard=shard.identity,
                cluster=cluster,
            )
        )
        ranges = ", ".join(f"{a}-{b}" for a, b in shard.slots)
        named = "shard id" if shard.shard_id else "lowest slot"
        if name != own:
            named = "earlier name (--previous, or the file --out rewrote)"
        comments[name] = (
            f"shard holding slots {ranges} ({len(replicas)} replica"
            f"{'' if len(replicas) == 1 else 's'}); named by its {named}: "
            "the probe re-reads where it is and which slots it holds"
        )
        if replicas:
            group = ReplicaGroup(
                name=name,
                members=(primary, *replicas),
                slots=shard.slots,
                kind="replication",
            )
            others, notes = database_groups(group, (databases or {}).get(shard.identity, {}))
            groups += [group, *others]
            comments.update(notes)
    covered = sum(b - a + 1 for s in shards for a, b in s.slots)
    header = [f"Discovered from {command} of Redis Cluster node {seed.url()}."]
    if state != "ok":
        header.append(f"cluster_state was {state!r} at discovery.")
    if covered != SLOT_COUNT:
        header.append(f"Only {covered} of {SLOT_COUNT} slots are served.")
    lonely = [names.get(s.identity, s.name) for s in shards if not s.replicas]
    if lonely:
        header.append(f"Shards without replicas (nothing to compare): {', '.join(lonely)}.")
    return Discovery(
        topology=Topology(regions=tuple(regions), groups=tuple(groups)),
        header="\n".join(header),
        comments=comments,
        endpoint_comments=endpoint_comments,
        facts={"command": command, "cluster_state": state, "slots_covered": covered},
    )
