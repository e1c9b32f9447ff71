"""What a replica group is at the start of a run: its kind, its primary, who follows it.

A group's kind decides how it is repaired (docs/repair/kinds.md). A configured
`replication` group, or an `auto` one with a replica among its members (`INFO
replication` says role:slave), is repaired through its primary: this reads
which member is the primary *now* (after a failover it is another member than
the config lists first), and which replicas take its writes: a replica
follows when its link is up and it shares the primary's replication ID
(chained replicas included). One that does not (link down, another primary)
is left to a resync. `INFO cluster` says whether members are Redis Cluster
nodes (scanned per slot, read with READONLY).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from replag.errors import EndpointError
from replag.repair.together import all_of
from replag.replication.info import parse_info
from replag.resp import RespConnection, pack
from replag.topology import Endpoint, ReplicaGroup

RepairKind = Literal["replication", "dynomite", "peers"]


@dataclass(frozen=True)
class MemberRole:
    """One member's `INFO replication` and `INFO cluster`, as far as repair needs them."""

    role: str  # "master", "slave", or "unknown" (not read: through an agent, or failed)
    replid: str = ""
    link_up: bool = False
    master: str = ""  # master_host:master_port of a replica
    cluster: bool = False
    error: str | None = None


@dataclass(frozen=True)
class GroupShape:
    """How a run treats a group: `kind`, the `primary` member (replication), the replicas
    that do not follow it (index → why), and whether its members are Cluster nodes."""

    kind: RepairKind
    primary: int | None = None
    unfollowing: dict[int, str] = field(default_factory=dict)
    cluster: bool = False
    why: str = ""  # how the kind was decided, for the report
    # Set when the group is a replication group without a usable primary.
    no_primary: str | None = None


async def read_role(member: Endpoint, timeout_s: float) -> MemberRole:
    """INFO replication and INFO cluster of `member`; an unreadable one is role "unknown"."""
    try:
        conn = await RespConnection.open(member, timeout_s=timeout_s)
    except EndpointError as exc:
        return MemberRole("unknown", error=exc.message)
    try:
        replication, cluster = await conn.request(
            pack(b"INFO", b"replication") + pack(b"INFO", b"cluster"), 2
        )
        conn.check([replication])
    except EndpointError as exc:
        return MemberRole("unknown", error=exc.message)
    finally:
        await conn.close()
    fields = parse_info(replication)
    role = fields.get("role", "unknown")
    return MemberRole(
        role=role if role in ("master", "slave") else "unknown",
        replid=fields.get("master_replid", ""),
        link_up=fields.get("master_link_status") == "up",
        master=f"{fields.get('master_host', '')}:{fields.get('master_port', '')}",
        cluster=isinstance(cluster, bytes) and b"cluster_enabled:1" in cluster,
    )


def shape_of(group: ReplicaGroup, roles: list[MemberRole]) -> GroupShape:
    """The group's shape from its members' roles (in member order)."""
    cluster = any(r.cluster for r in roles)
    names = [m.name for m in group.members]
    if group.kind in ("dynomite", "peers"):
        return GroupShape(group.kind, cluster=cluster, why=f"kind = {group.kind!r}")
    primaries = [i for i, r in enumerate(roles) if r.role == "master"]
    if group.kind == "auto":
        # Any replica among the members makes it a replication group: a replica is never
        # written, whatever the state of its link (which decides only who is fixed).
        if not any(r.role == "slave" for r in roles):
            return GroupShape("peers", cluster=cluster, why="kind auto: no member is a replica")
        why = "kind auto: members are a primary's replicas"
        if len(primaries) == 1:
            why = f"kind auto: {names[primaries[0]]} is the primary, the others its replicas"
    else:
        why = "kind = 'replication'"
    if len(primaries) != 1:
        roles_text = ", ".join(f"{n} {r.role}" for n, r in zip(names, roles, strict=True))
        problem = "no member is a primary" if not primaries else "several members are primaries"
        return GroupShape(
            "replication", cluster=cluster, why=why, no_primary=f"{problem} ({roles_text})"
        )
    primary = primaries[0]
    unfollowing: dict[int, str] = {}
    for i, r in enumerate(roles):
        if i == primary:
            continue
        if r.role == "unknown":
            unfollowing[i] = f"its role could not be read ({r.error or 'through an agent'})"
        elif r.role != "slave":
            unfollowing[i] = f"it is not a replica (role {r.role})"
        elif not r.link_up:
            unfollowing[i] = f"its link to its primary ({r.master}) is down"
        elif r.replid != roles[primary].replid:
            unfollowing[i] = f"it replicates from another primary ({r.master})"
    return GroupShape("replication", primary, unfollowing, cluster, why)


async def group_shape(
    group: ReplicaGroup, *, timeout_s: float, direct: list[bool] | None = None
) -> GroupShape:
    """Read every member's role and decide the shape. Members not `direct` (reached through
    their region's agent) cannot be read from here: a replication group with one is taken
    as the config lists it, its first member the primary."""
    reach = direct if direct is not None else [True] * len(group.members)
    if group.kind == "replication" and not all(reach):
        why = "kind = 'replication', members behind agents: the first member is the primary"
        return GroupShape("replication", 0, why=why)
    roles = await all_of(
        read_role(m, timeout_s) if ok else _through_agent()
        for m, ok in zip(group.members, reach, strict=True)
    )
    return shape_of(group, list(roles))


async def _through_agent() -> MemberRole:
    return MemberRole("unknown", error="reached through its region's agent")


def cluster_members(group: ReplicaGroup, shape: GroupShape) -> tuple[Endpoint, ...]:
    """The members as connections to them must open: Cluster nodes with READONLY."""
    if not shape.cluster:
        return group.members
    return tuple(replace(m, cluster=True) for m in group.members)
