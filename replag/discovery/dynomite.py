"""Discovery of a Dynomite cluster from one node's stats port.

`/cluster_describe` lists DCs, racks and nodes, but names each node by its
peer (dnode) port only; `PortMap` turns that into the node's client port and
stats port by convention (Netflix's 8101/8102/22222) or per-node overrides.
Each node's backend Redis is what its own `/info` names (a `redis:` override
wins; the 22122 convention is the last resort). Each DC becomes a region
written through one node's client port, with every other node's client port
of the DC as a fallback, and observed on every rack's backend Redis; nodes
holding the same token across racks and DCs form a replica group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from replag.discovery.contacts import Contacts
from replag.discovery.deadline import Deadline
from replag.discovery.dynomite_backends import read_backend
from replag.discovery.dynomite_ports import (
    Address,
    NodePorts,
    PortMap,
    load_port_map_file,
    parse_port_override,
)
from replag.discovery.http import fetch_json_object, fetch_text
from replag.discovery.result import Discovery
from replag.errors import DiscoveryError, UsageError
from replag.topology import Endpoint, Region, ReplicaGroup, Topology

__all__ = [
    "Address",
    "Consistency",
    "DynomiteNode",
    "NodePorts",
    "PortMap",
    "discover_dynomite",
    "fetch_consistency",
    "load_port_map_file",
    "parse_port_override",
]

CONSISTENCY_LEVELS = ("DC_ONE", "DC_QUORUM", "DC_SAFE_QUORUM", "DC_EACH_SAFE_QUORUM")


@dataclass(frozen=True, kw_only=True)
class DynomiteNode:
    dc: str
    rack: str
    host: str
    peer_port: int
    token: str
    client: Address
    stats: Address
    redis: Address | None = None  # None until read from the node's /info
    redis_from: str = "--port-map"  # where `redis` came from: --port-map, /info, convention

    @property
    def backend(self) -> Address:
        assert self.redis is not None, "backends are filled in before they are used"
        return self.redis

    @property
    def label(self) -> str:
        return f"{self.dc}/{self.rack}"

    @property
    def peer(self) -> str:
        return f"{self.host}:{self.peer_port}"


@dataclass(frozen=True, kw_only=True)
class Consistency:
    read: str
    write: str


def parse_cluster_describe(
    data: Mapping[str, Any], *, where: str, ports: PortMap
) -> list[DynomiteNode]:
    """Nodes of a `/cluster_describe` answer, in its order; DiscoveryError on anything odd."""
    dcs = data.get("dcs")
    if not isinstance(dcs, list) or not dcs:
        raise DiscoveryError("no `dcs` list in /cluster_describe's answer", where=where)
    nodes: list[DynomiteNode] = []
    for i, dc in enumerate(dcs):
        dc_name = _name(dc, f"dcs[{i}]", where)
        racks = dc.get("racks")
        if not isinstance(racks, list) or not racks:
            raise DiscoveryError(f"DC {dc_name!r} has no `racks` list", where=where)
        for j, rack in enumerate(racks):
            rack_name = _name(rack, f"dcs[{i}].racks[{j}]", where)
            servers = rack.get("servers")
            if not isinstance(servers, list) or not servers:
                raise DiscoveryError(f"rack {dc_name}/{rack_name} lists no servers", where=where)
            for k, server in enumerate(servers):
                key = f"dcs[{i}].racks[{j}].servers[{k}] ({dc_name}/{rack_name})"
                nodes.append(_node(server, dc_name, rack_name, key=key, where=where, ports=ports))
    return nodes


def _check_distinct(nodes: list[DynomiteNode], *, where: str) -> None:
    seen: dict[Address, DynomiteNode] = {}
    for node in nodes:
        for address in (node.backend, node.client):
            if address in seen:
                raise DiscoveryError(
                    f"nodes {seen[address].label} and {node.label} both map to {address}: "
                    "give per-node ports with --port-map",
                    where=where,
                )
            seen[address] = node


async def fill_backends(
    nodes: list[DynomiteNode], *, ports: PortMap, timeout_s: float, where: str
) -> tuple[list[DynomiteNode], list[str]]:
    """Each node's backend from its /info (all read at once, under discovery's one
    deadline) where no override gives it;
    a node whose /info names none falls back on the convention if it keeps to it, else
    DiscoveryError saying what to add. Also notes on each fallback."""
    need = [n for n in nodes if n.redis is None]
    found = await Deadline(timeout_s).each(
        need,
        lambda n: read_backend(str(n.stats), node_host=n.host, timeout_s=timeout_s),
        where=lambda n: f"http://{n.stats}/info",
    )
    filled: dict[int, DynomiteNode] = {}
    notes = []
    for node, result in zip(need, found, strict=True):
        if isinstance(result, tuple):
            filled[id(node)] = replace(node, redis=Address(*result), redis_from="/info")
            continue
        why = f"could not be read ({result})" if result is not None else "names no backend"
        if node.peer_port != ports.peer:
            raise DiscoveryError(
                f"the backend Redis of node {node.peer} ({node.label}) is unknown: its /info "
                f"(http://{node.stats}/info) {why}; give it with --port-map "
                f"{node.peer}=redis:PORT",
                where=where,
            )
        backend = Address(node.host, ports.redis)
        filled[id(node)] = replace(node, redis=backend, redis_from="convention")
        notes.append(
            f"Node {node.peer} ({node.label}): /info {why}; backend {backend} by convention."
        )
    return [filled.get(id(n), n) for n in nodes], notes


def _name(entry: Any, key: str, where: str) -> str:
    if not isinstance(entry, dict):
        raise DiscoveryError(f"{key} is not an object", where=where)
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise DiscoveryError(f"{key} has no `name`", where=where)
    return name


def _node(server: Any, dc: str, rack: str, *, key: str, where: str, ports: PortMap) -> DynomiteNode:
    if not isinstance(server, dict):
        raise DiscoveryError(f"{key} is not an object", where=where)
    host = server.get("host") or server.get("name")
    port = server.get("port")
    token = server.get("token")
    if not isinstance(host, str) or not host:
        raise DiscoveryError(f"{key} has no `host`", where=where)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise DiscoveryError(f"{key} has no valid peer `port` (got {port!r})", where=where)
    # Dynomite prints a token as a number; multi-token nodes as a comma-separated string.
    if isinstance(token, bool) or not isinstance(token, int | str) or str(token).strip() == "":
        raise DiscoveryError(f"{key} has no `token` (got {token!r})", where=where)
    mapped = ports.resolve(host, port, where=where, label=f"{dc}/{rack}")
    return DynomiteNode(
        dc=dc,
        rack=rack,
        host=host,
        peer_port=port,
        token=str(token).replace(" ", ""),
        client=mapped["client"],
        redis=mapped.get("redis"),
        stats=mapped["stats"],
    )


def parse_consistency(text: str, *, where: str) -> Consistency:
    """`Read Consistency: DC_ONE\\r\\nWrite Consistency: DC_ONE\\r\\n` → Consistency."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        label, sep, value = line.partition(":")
        if sep and label.strip().lower() in ("read consistency", "write consistency"):
            found[label.strip().split()[0].lower()] = value.strip().upper()
    for kind in ("read", "write"):
        if kind not in found:
            shown = text[:80]
            raise DiscoveryError(f"no '{kind.title()} Consistency:' line in {shown!r}", where=where)
        if found[kind] not in CONSISTENCY_LEVELS:
            raise DiscoveryError(f"unknown {kind} consistency {found[kind]!r}", where=where)
    return Consistency(read=found["read"], write=found["write"])


async def fetch_consistency(stats_url: str, *, timeout_s: float) -> Consistency | None:
    """The node's process-wide read/write consistency; None if it has no /get_consistency."""
    url = f"{stats_url.rstrip('/')}/get_consistency"
    text = await fetch_text(url, timeout_s=timeout_s)
    return None if text is None else parse_consistency(text, where=url)


async def discover_dynomite(
    stats_url: str, *, ports: PortMap, timeout_s: float, contacts: Contacts | None = None
) -> Discovery:
    """Read `/cluster_describe` and `/get_consistency` of one node and map the cluster; a
    node outside `contacts.networks` (--allow-networks) is neither asked nor written."""
    base = _base_url(stats_url)
    where = f"{base}/cluster_describe"
    data = await fetch_json_object(where, timeout_s=timeout_s)
    nodes = parse_cluster_describe(data, where=where, ports=ports)
    if contacts is not None and contacts.networks is not None:
        nodes = [n for n in nodes if await contacts.admits(n.host, n.peer_port)]
        if not nodes:
            raise DiscoveryError("every node it describes is outside --allow-networks", where=where)
    nodes, notes = await fill_backends(nodes, ports=ports, timeout_s=timeout_s, where=where)
    if contacts is not None and contacts.networks is not None:
        # A backend a node's /info names outside the networks: the node is not written
        # (its backend would be observed, and checked, there), and the header names it.
        nodes = [n for n in nodes if await contacts.admits(n.backend.host, n.backend.port)]
        if not nodes:
            raise DiscoveryError("every node's backend is outside --allow-networks", where=where)
    _check_distinct(nodes, where=where)
    consistency = await fetch_consistency(base, timeout_s=timeout_s)
    return dynomite_topology(nodes, seed_url=base, consistency=consistency, notes=notes)


def _base_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--dynomite {url!r}: expected http://HOST:STATS_PORT")
    for suffix in ("/cluster_describe", "/info"):
        url = url.rstrip("/").removesuffix(suffix)
    return url.rstrip("/")


def dynomite_topology(
    nodes: list[DynomiteNode],
    *,
    seed_url: str,
    consistency: Consistency | None,
    notes: list[str] | None = None,
) -> Discovery:
    """Regions (one per DC) and replica groups (one per token) of `nodes`."""
    names = _NodeNames(nodes)
    backends = {
        node: Endpoint(
            name=names.base(node),
            host=node.backend.host,
            port=node.backend.port,
            region=node.dc,
            rack=node.rack,
        )
        for node in nodes
    }
    endpoint_comments = {
        backends[n].name: f"backend Redis of node {n.peer}: {n.label}, token {n.token} "
        f"(from {n.redis_from})"
        for n in nodes
    }
    seed = next((n for n in nodes if seed_url.endswith(f"//{n.stats}")), None)
    regions, comments = [], {}
    for dc in dict.fromkeys(n.dc for n in nodes):
        members = [n for n in nodes if n.dc == dc]
        writer = seed if seed is not None and seed.dc == dc else members[0]
        # Every node of the DC takes writes: the others are the probe's fallbacks, in order.
        writers = [writer, *(n for n in members if n is not writer)]
        clients = [_client_endpoint(n, names.base(n)) for n in writers]
        for node, client in zip(writers, clients, strict=True):
            endpoint_comments[client.name] = (
                f"client port of node {node.host}:{node.peer_port} ({node.label})"
            )
        regions.append(
            Region(
                name=dc,
                write=clients[0],
                write_fallbacks=tuple(clients[1:]),
                replicas=tuple(backends[n] for n in members),
            )
        )
        racks = ", ".join(dict.fromkeys(n.rack for n in members))
        comments[dc] = f"DC {dc} (racks {racks}), from /cluster_describe of {seed_url}"
    groups = _token_groups(nodes, backends, comments)
    header = _header(nodes, seed_url=seed_url, consistency=consistency, shared=names.shared)
    header = "\n".join([header, *(notes or [])])
    return Discovery(
        topology=Topology(regions=tuple(regions), groups=tuple(groups)),
        header=header,
        comments=comments,
        endpoint_comments=endpoint_comments,
        settings={"dynomite_stats_urls": [f"http://{n.stats}" for n in nodes]},
        facts={
            "consistency": consistency and {"read": consistency.read, "write": consistency.write}
        },
    )


def _token_groups(
    nodes: list[DynomiteNode], backends: dict[DynomiteNode, Endpoint], comments: dict[str, str]
) -> list[ReplicaGroup]:
    """One replica group per token held more than once (its comment added to `comments`)."""
    groups = []
    for token in dict.fromkeys(n.token for n in nodes):
        holders = [n for n in nodes if n.token == token]
        if len(holders) < 2:
            continue  # one copy: nothing to compare it with
        name = f"token-{token}"
        members = tuple(backends[n] for n in holders)
        groups.append(ReplicaGroup(name=name, members=members, kind="dynomite"))
        comments[name] = f"token {token}: held by " + ", ".join(n.label for n in holders)
    return groups


class _NodeNames:
    """Endpoint names: DC and rack, plus the token where a rack holds several."""

    def __init__(self, nodes: list[DynomiteNode]) -> None:
        self.per_rack: dict[tuple[str, str], int] = {}
        for node in nodes:
            self.per_rack[(node.dc, node.rack)] = self.per_rack.get((node.dc, node.rack), 0) + 1
        self.shared = any(count > 1 for count in self.per_rack.values())

    def base(self, node: DynomiteNode) -> str:
        several = self.per_rack[(node.dc, node.rack)] > 1
        return f"{node.dc}-{node.rack}" + (f"-{node.token}" if several else "")


def _client_endpoint(node: DynomiteNode, base_name: str) -> Endpoint:
    """The node's client port: where its region's probes are written."""
    return Endpoint(
        name=f"{base_name}-dynomite",
        host=node.client.host,
        port=node.client.port,
        kind="dynomite",
        region=node.dc,
        rack=node.rack,
    )


def _header(
    nodes: list[DynomiteNode], *, seed_url: str, consistency: Consistency | None, shared: bool
) -> str:
    """The written topology's header: where it came from and what to know about it."""
    header = [f"Discovered from Dynomite {seed_url} (/cluster_describe, /get_consistency)."]
    if consistency is not None:
        header.append(
            f"Cluster consistency: read {consistency.read}, write {consistency.write}. "
            "Per-connection: settings.dynomite_consistency."
        )
    if shared:
        header.append(
            "Racks hold several tokens: a probe key lands on one node per rack, so only the "
            "backends owning its token see it."
        )
    tokens = [n.token for n in nodes]
    lonely = [t for t in dict.fromkeys(tokens) if tokens.count(t) < 2]
    if lonely:
        header.append(f"Tokens held once (no replica to compare): {', '.join(lonely)}.")
    return "\n".join(header)
