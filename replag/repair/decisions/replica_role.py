"""Whether a server is a Redis replica, and how its own full sync rebuilds it.

A replica of a replication group is refilled by its primary (a full sync), never by
copying keys into it: it refuses writes, and anything written to it would be
overwritten by the next sync anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

from replag.topology import Endpoint
from replag.wire.resp import RespConnection, pack


@dataclass(frozen=True)
class Primary:
    host: str
    port: int
    link: str  # master_link_status: up / down
    syncing: bool  # master_sync_in_progress


async def replica_of(endpoint: Endpoint, timeout_s: float) -> Primary | None:
    """The primary `endpoint` replicates from (INFO replication), None for a primary."""
    conn = await RespConnection.open(endpoint, timeout_s=timeout_s)
    try:
        (info,) = await conn.request(pack(b"INFO", b"replication"), 1)
        conn.check([info])
    finally:
        await conn.close()
    fields: dict[str, str] = {}
    for line in bytes(info).decode(errors="replace").splitlines():
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    if fields.get("role") != "slave":
        return None
    return Primary(
        fields.get("master_host", "?"),
        int(fields.get("master_port", "0") or 0),
        fields.get("master_link_status", "?"),
        fields.get("master_sync_in_progress") == "1",
    )


def resync_advice(replica: Endpoint, primary: Primary) -> str:
    """What to do instead of a rebuild, for a replica of `primary`."""
    at = f"{primary.host}:{primary.port}"
    state = (
        "a full sync is in progress now"
        if primary.syncing
        else f"its link to the primary is {primary.link}"
    )
    return (
        f"{replica.name} is a Redis replica of {at} ({state}): Redis's own full sync rebuilds "
        f"it, not replag. A replica restarted without its data files asks for one by itself. "
        f"To force one on a running replica: `redis-cli -h {replica.host} -p {replica.port} "
        f"REPLICAOF NO ONE` then `... REPLICAOF {primary.host} {primary.port}` (the first "
        f"gives it a new replication ID its primary does not know, so the second cannot "
        f"resume partially); then watch `INFO replication` there until "
        f"master_sync_in_progress:0 and master_link_status:up."
    )
