"""Databases that hold keys and that no group covers: what a check did not look at.

A group's members name one database each (the URL's `/N`, 0 by default); a
server can hold keys in others. A check reads `INFO keyspace` on every member
it scanned and names each database with keys that no group of the config
covers, so a clean result is never printed over data nobody compared.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from replag.errors import EndpointError, ReplyShapeError
from replag.repair.keyspace.together import all_of
from replag.replication.info import keyspace_keys
from replag.topology import Endpoint, ReplicaGroup, Topology
from replag.wire.resp import RespConnection, pack

logger = logging.getLogger(__name__)


def covered(topology: Topology) -> set[tuple[str, int, int]]:
    """(host, port, db) of every group member of the config."""
    return {(m.host, m.port, m.db) for g in topology.groups for m in g.members}


async def _keyspace(member: Endpoint, timeout_s: float) -> dict[int, int]:
    conn = await RespConnection.open(member, timeout_s=timeout_s)
    try:
        (reply,) = await conn.request(pack(b"INFO", b"keyspace"), 1)
    finally:
        await conn.close()
    conn.check([reply])
    return keyspace_keys(reply)


async def unchecked_databases(
    topology: Topology, groups: Sequence[ReplicaGroup], *, timeout_s: float, skip: set[str]
) -> list[dict[str, Any]]:
    """Per member of `groups` read directly (not named in `skip`), each database holding
    keys that no group of `topology` covers: {member, address, db, keys}."""
    members = {
        (m.host, m.port): m
        for g in groups
        for m in g.members
        if m.kind == "redis" and m.name not in skip
    }
    known = covered(topology)
    # Nodes of a Redis Cluster's shards (regions with slots): discovery covers their
    # databases too (Valkey 9's cluster-databases).
    shards = {
        (ep.host, ep.port)
        for r in topology.regions
        if r.slots
        for ep in ((r.write,) if r.write else ()) + r.replicas
    }

    async def one(member: Endpoint) -> list[dict[str, Any]]:
        try:
            dbs = await _keyspace(member, timeout_s)
        except ReplyShapeError:
            raise  # it answered, wrongly: not a server to check (one line, the run's end)
        except EndpointError as exc:
            logger.warning(
                "%s: INFO keyspace not read (other databases unknown): %s", member.name, exc
            )
            return []
        return [
            {"member": member.name, "address": member.address, "db": db, "keys": keys}
            | ({"cluster": True} if member.cluster or (member.host, member.port) in shards else {})
            for db, keys in sorted(dbs.items())
            if keys and (member.host, member.port, db) not in known
        ]

    found = await all_of(one(m) for m in members.values())
    return [row for rows in found for row in rows]
