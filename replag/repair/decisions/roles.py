"""What a replica group is at the start of a run: its kind, its primary, who follows it.

A group's kind decides how it is repaired (docs/repair/kinds.md). A configured
`replication` group, or an `auto` one with a replica among its members (`INFO
replication` says role:slave), is repaired through its primary: this reads
which member is the primary *now* (after a failover it is another member than
the config lists first), and which replicas take its writes: a replica
follows when its link is up and it shares the primary's replication ID
(chained replicas included). One that does not (link down, another primary)
is left to a resync. `INFO cluster` says whether members are Redis Cluster
nodes (scanned per slot, read with READONLY). A member in a region that runs an
agent is read by the agent (`GET /agent/v1/replicas/NAME/role`): where it cannot
say (unreachable, an agent older than that call), the member's role is unknown,
and a group that needs it has no primary: nothing in it is written, and the
report says why.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from replag.errors import AgentError, EndpointError
from replag.repair.keyspace.together import all_of
from replag.replication.info import parse_info
from replag.topology import Endpoint, ReplicaGroup
from replag.wire.resp import RespConnection, pack

if TYPE_CHECKING:
    from replag.repair.trees.remote import AgentClient

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

    def to_dict(self) -> dict[str, Any]:
        """What an agent answers for its replica."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> MemberRole:
        """An agent's answer; ValueError when it is not one."""
        if not isinstance(data, dict) or data.get("role") not in ("master", "slave", "unknown"):
            raise ValueError(f"not a role: {str(data)[:200]}")
        return cls(
            role=data["role"],
            replid=str(data.get("replid", "")),
            link_up=bool(data.get("link_up", False)),
            master=str(data.get("master", "")),
            cluster=bool(data.get("cluster", False)),
            error=str(data["error"]) if data.get("error") is not None else None,
        )


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
        error=None if role in ("master", "slave") else f"INFO replication says role {role!r}",
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
    unknown = [f"{n} ({r.error})" for n, r in zip(names, roles, strict=True) if r.role == "unknown"]
    if group.kind == "auto":
        # Any replica among the members makes it a replication group: a replica is never
        # written, whatever the state of its link (which decides only who is fixed).
        if not any(r.role == "slave" for r in roles):
            if unknown:
                # Peers or a primary's replicas? Guessing peers would write to replicas.
                return GroupShape(
                    "replication",
                    cluster=cluster,
                    why="kind auto, a member's role unknown",
                    no_primary=f"the role of {', '.join(unknown)} could not be read, so "
                    "whether the group is a primary's replicas or peers is unknown (set kind "
                    "in [[groups]], or make the member readable)",
                )
            return GroupShape("peers", cluster=cluster, why="kind auto: no member is a replica")
        why = "kind auto: members are a primary's replicas"
        if len(primaries) == 1:
            why = f"kind auto: {names[primaries[0]]} is the primary, the others its replicas"
    else:
        why = "kind = 'replication'"
    if len(primaries) != 1:
        roles_text = ", ".join(
            f"{n} {r.role}" + (f": {r.error}" if r.role == "unknown" and r.error else "")
            for n, r in zip(names, roles, strict=True)
        )
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
    group: ReplicaGroup,
    *,
    timeout_s: float,
    agents: Sequence[AgentClient | None] | None = None,
) -> GroupShape:
    """Read every member's role and decide the shape: here, or (`agents[i]` not None) by
    the agent of the member's region."""
    clients = agents if agents is not None else [None] * len(group.members)
    roles = await all_of(
        read_role(m, timeout_s) if client is None else role_through_agent(client, m.name)
        for m, client in zip(group.members, clients, strict=True)
    )
    return shape_of(group, list(roles))


async def role_through_agent(client: AgentClient, name: str) -> MemberRole:
    """`name`'s role as its region's agent reads it; "unknown" when the agent cannot say."""
    try:
        data, _ = await client.request("GET", f"/replicas/{name}/role", replica=name)
        return MemberRole.from_dict(json.loads(data))
    except AgentError as exc:
        return MemberRole("unknown", error=f"its agent could not say: {exc.message}")
    except ValueError as exc:
        return MemberRole("unknown", error=f"its agent's answer is not a role: {exc}")


def cluster_members(group: ReplicaGroup, shape: GroupShape) -> tuple[Endpoint, ...]:
    """The members as connections to them must open: Cluster nodes with READONLY."""
    if not shape.cluster:
        return group.members
    return tuple(replace(m, cluster=True) for m in group.members)
