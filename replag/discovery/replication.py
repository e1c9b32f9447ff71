"""Discovery of a Redis primary and every replica INFO replication leads to.

Starting anywhere in the tree (a replica's `master_host` leads up to the
primary), each node's `slaveN:ip=…,port=…` lines lead down to its replicas,
chained ones included. Replicas are reached with the credentials of the URL
given, as replicas of one primary normally share them: `Contacts` records every
address they went to, and refuses hosts outside --allow-networks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from replag.discovery.contacts import Contacts, OutsideNetworks
from replag.discovery.deadline import Deadline
from replag.discovery.result import Discovery
from replag.errors import DiscoveryError, EndpointError, UsageError
from replag.topology import Endpoint, Region, ReplicaGroup, Topology
from replag.wire.connections import endpoint_errors
from replag.wire.connector import Connector
from replag.wire.reply_limits import DEFAULT as DEFAULT_LIMITS
from replag.wire.reply_limits import ReplyLimits

# A replication tree deeper than this is a loop in what the servers told us.
_MAX_HOPS = 32


@dataclass(frozen=True, kw_only=True)
class ReplicaLink:
    """One replica as its upstream lists it."""

    endpoint: Endpoint
    upstream: Endpoint
    state: str
    offset: int | None


async def read_replication_info(
    endpoint: Endpoint, *, timeout_s: float, contacts: Contacts | None = None
) -> dict[str, Any]:
    if contacts is not None:
        await contacts.reach(endpoint)
    client = Connector(endpoint, timeout_s=timeout_s).client()
    try:
        with endpoint_errors(endpoint, "INFO replication"):
            info: dict[str, Any] = await client.info("replication")
    finally:
        await client.aclose()
    if "role" not in info:
        raise DiscoveryError("INFO replication has no `role` line", where=endpoint.url())
    return info


async def read_keyspace(endpoint: Endpoint, *, timeout_s: float) -> dict[int, int]:
    """Database number → keys (INFO keyspace) of `endpoint`."""
    client = Connector(endpoint, timeout_s=timeout_s).client()
    try:
        with endpoint_errors(endpoint, "INFO keyspace"):
            info: dict[str, Any] = await client.info("keyspace")
    finally:
        await client.aclose()
    return {
        int(name[2:]): int(value.get("keys", 0))
        for name, value in info.items()
        if name.startswith("db") and name[2:].isdigit() and isinstance(value, dict)
    }


def database_groups(
    group: ReplicaGroup, databases: Mapping[int, int]
) -> tuple[list[ReplicaGroup], dict[str, str]]:
    """A group per other database that holds keys on `group`'s servers (the same members,
    their URLs naming that database), and a comment for each: a check compares them all."""
    groups, comments = [], {}
    own = group.members[0].db
    for db, keys in sorted(databases.items()):
        if db == own or keys <= 0:
            continue
        name = f"{group.name}-db{db}"
        members = tuple(replace(m, db=db, name=f"{m.name}/db{db}") for m in group.members)
        groups.append(replace(group, name=name, members=members))
        comments[name] = (
            f"database {db} of the same servers ({keys:,} keys in INFO keyspace at discovery): "
            "compared as a group of its own"
        )
    return groups, comments


def replicas_listed(info: dict[str, Any], upstream: Endpoint) -> list[ReplicaLink]:
    """The `slaveN` entries of one INFO replication answer."""
    links = []
    for key in sorted(
        (k for k in info if k.startswith("slave") and k[5:].isdigit()), key=lambda k: int(k[5:])
    ):
        entry = info[key]
        if not isinstance(entry, dict) or "ip" not in entry or "port" not in entry:
            raise DiscoveryError(
                f"cannot read {key} in INFO replication: {entry!r}", where=upstream.url()
            )
        try:
            port = int(entry["port"])
        except (TypeError, ValueError):
            raise DiscoveryError(
                f"{key} has a bad port {entry['port']!r}", where=upstream.url()
            ) from None
        # An empty or unknown announced ip means "the host you reached me on".
        host = str(entry["ip"]) if entry["ip"] not in ("", "?") else upstream.host
        offset = entry.get("offset")
        links.append(
            ReplicaLink(
                endpoint=_node(upstream, host, port),
                upstream=upstream,
                state=str(entry.get("state", "unknown")),
                offset=int(offset)
                if isinstance(offset, int | str) and str(offset).isdigit()
                else None,
            )
        )
    return links


def _node(like: Endpoint, host: str, port: int) -> Endpoint:
    return replace(like, name=f"{host}:{port}", host=host, port=port, kind="redis", region=None)


async def find_primary(
    seed: Endpoint, *, timeout_s: float, contacts: Contacts | None = None
) -> Endpoint:
    """Follow `master_host:master_port` up from `seed` to the node whose role is master."""
    node = seed
    for _ in range(_MAX_HOPS):
        info = await read_replication_info(node, timeout_s=timeout_s, contacts=contacts)
        if info["role"] == "master":
            return node
        host, port = info.get("master_host"), info.get("master_port")
        if not host or not port:
            raise DiscoveryError("a replica without master_host/master_port", where=node.url())
        node = _node(seed, str(host), int(port))
    raise DiscoveryError(f"no primary within {_MAX_HOPS} hops up (a loop?)", where=seed.url())


async def discover_replication(
    url: str,
    *,
    timeout_s: float,
    contacts: Contacts | None = None,
    name: str | None = None,
    limits: ReplyLimits = DEFAULT_LIMITS,
) -> Discovery:
    """The primary of `url`'s replication tree and every replica under it (those outside
    `contacts.networks` left out, never contacted), each reply within `limits`; its region
    and group are named `name`, else after the primary (host:port), so two replica sets
    never share a name."""
    try:
        seed = replace(Endpoint.from_url(url), limits=limits)
    except ValueError as exc:
        raise UsageError(f"--redis: {exc}") from None
    primary = await find_primary(seed, timeout_s=timeout_s, contacts=contacts)
    region = name or primary.address
    primary = replace(primary, name=primary.address, region=region)
    links: list[ReplicaLink] = []
    unread: dict[str, str] = {}
    frontier, seen = [primary], {primary.address}
    # Each level of the tree is asked at once, and the whole walk has one deadline: 100
    # replicas whose SYNs are dropped cost one timeout, not 100 in a row.
    deadline = Deadline(timeout_s)
    for _ in range(_MAX_HOPS):
        if not frontier:
            break
        below = []
        read = await deadline.each(
            frontier,
            lambda node: read_replication_info(node, timeout_s=timeout_s, contacts=contacts),
            where=Endpoint.url,
            errors=(OutsideNetworks, EndpointError),
        )
        for node, info in zip(frontier, read, strict=True):
            if isinstance(info, OutsideNetworks):
                continue  # left out of the file: later runs would send it the credentials too
            if isinstance(info, EndpointError):
                if node is primary:
                    raise info
                # Listed by its upstream yet not answering us (firewall, other password):
                # keep it, and say its own replicas could not be followed.
                unread[node.name] = info.message
                continue
            assert isinstance(info, dict)
            for link in replicas_listed(info, node):
                if link.endpoint.address not in seen:
                    seen.add(link.endpoint.address)
                    links.append(link)
                    below.append(link.endpoint)
        frontier = below
    if contacts is not None and contacts.refused:
        links = [link for link in links if link.endpoint.address not in contacts.refused]
    databases = await read_keyspace(primary, timeout_s=timeout_s)
    return replication_topology(
        primary, links, unread=unread, source=seed.url(), databases=databases
    )


def _region_of(primary: Endpoint) -> str:
    return primary.region or primary.address


def replication_topology(
    primary: Endpoint,
    links: list[ReplicaLink],
    *,
    unread: dict[str, str],
    source: str,
    databases: Mapping[int, int] | None = None,
) -> Discovery:
    """One region (write = primary, replicas = all) and one replica group, both named as
    the primary's region (its host:port unless named)."""
    name = _region_of(primary)
    primary = replace(primary, region=name)
    replicas = tuple(replace(link.endpoint, region=name) for link in links)
    endpoint_comments = {primary.name: "primary (role:master in INFO replication)"}
    for link in links:
        chained = link.upstream.address != primary.address
        text = (
            f"chained replica: replicates from {link.upstream.address}, not the primary"
            if chained
            else f"replica of the primary {primary.address}"
        )
        text += f" (state {link.state}"
        text += f", offset {link.offset})" if link.offset is not None else ")"
        if link.endpoint.name in unread:
            text += f"\nits INFO could not be read ({unread[link.endpoint.name]}): "
            text += "replicas below it are not listed"
        endpoint_comments[link.endpoint.name] = text
    groups: tuple[ReplicaGroup, ...] = ()
    comments = {
        name: f"primary {primary.address} and the {len(links)} replica"
        f"{'' if len(links) == 1 else 's'} INFO replication leads to (lag per replica)",
    }
    if replicas:
        group = ReplicaGroup(name=name, members=(primary, *replicas), kind="replication")
        comments[name] += "; as a group, the primary and every replica: the same data"
        others, more = database_groups(group, databases or {})
        groups = (group, *others)
        comments.update(more)
    header = [f"Discovered from INFO replication, starting at {source}."]
    if not replicas:
        header.append("The primary lists no replicas: nothing to probe or repair against.")
    return Discovery(
        topology=Topology(
            regions=(Region(name=name, write=primary, replicas=replicas),), groups=groups
        ),
        header="\n".join(header),
        comments=comments,
        endpoint_comments=endpoint_comments,
        facts={
            "replicas": len(links),
            "chained": sum(link.upstream.address != primary.address for link in links),
        },
    )
