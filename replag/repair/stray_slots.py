"""Redis Cluster: keys a shard's members hold in slots the shard no longer serves.

A reshard moves a slot's keys with MIGRATE on the primary, which deletes each
key there and replicates the deletion; a key only a replica held (divergence)
is not the primary's to move, and stays on the replica in a slot its shard no
longer serves. Clients never read it (the replica answers MOVED), the scan
leaves it out (as it does any key served elsewhere), and the shard's primary
cannot delete it (the slot is not its own): only a full resync of that member
removes it. `stray_keys` finds such keys with CLUSTER COUNTKEYSINSLOT (O(1) per
slot, pipelined) on every member, for the slots the shard does not serve, and
names a few with CLUSTER GETKEYSINSLOT, with the group that serves the slot.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from replag.errors import EndpointError
from replag.repair.keyspace.observe import key_to_json
from replag.repair.keyspace.slots import SLOTS, ranges
from replag.repair.keyspace.together import all_of
from replag.topology import Endpoint, Topology
from replag.wire.resp import RespConnection, pack

logger = logging.getLogger(__name__)

EXAMPLES = 5  # keys named per member and serving group


def slot_servers(reply: object) -> dict[int, str]:
    """Slot → the address (host:port) of its primary, from a CLUSTER SLOTS reply."""
    out: dict[int, str] = {}
    if not isinstance(reply, list):
        return out
    for row in reply:
        if not isinstance(row, list) or len(row) < 3 or not isinstance(row[2], list):
            continue
        first, last, primary = row[0], row[1], row[2]
        host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        for slot in range(int(first), int(last) + 1):
            out[slot] = f"{host}:{int(primary[1])}"
    return out


def _group_of(topology: Topology, address: str) -> str:
    for group in topology.groups:
        if any(m.address == address for m in group.members):
            return group.name
    return "no group of the config"


async def _member_strays(
    member: Endpoint, foreign: list[int], timeout_s: float
) -> tuple[dict[int, str], dict[int, int], dict[int, list[bytes]]]:
    conn = await RespConnection.open(member, timeout_s=timeout_s)
    try:
        (served,) = await conn.request(pack(b"CLUSTER", b"SLOTS"), 1)
        counts = await conn.request(
            b"".join(pack(b"CLUSTER", b"COUNTKEYSINSLOT", b"%d" % s) for s in foreign),
            len(foreign),
        )
        conn.check(counts)
        held = {s: int(n) for s, n in zip(foreign, counts, strict=True) if int(n) > 0}
        named: dict[int, list[bytes]] = {}
        if held:
            asked = sorted(held)
            replies = await conn.request(
                b"".join(
                    pack(b"CLUSTER", b"GETKEYSINSLOT", b"%d" % s, b"%d" % EXAMPLES) for s in asked
                ),
                len(asked),
            )
            conn.check(replies)
            named = {s: list(r) for s, r in zip(asked, replies, strict=True)}
    finally:
        await conn.close()
    return slot_servers(served), held, named


async def stray_keys(
    topology: Topology,
    members: Sequence[Endpoint],
    owned: set[int],
    *,
    timeout_s: float,
    skip: set[int] | frozenset[int] = frozenset(),
) -> list[dict[str, Any]]:
    """Per member and serving group: keys held in slots outside `owned` (the shard's), and
    outside `skip` (slots moving during the run). Rows: member, keys, slots (ranges),
    served_by (group), served_at (its primary), examples (keys)."""
    foreign = [s for s in range(SLOTS) if s not in owned and s not in skip]
    if not foreign:
        return []

    async def one(member: Endpoint) -> list[dict[str, Any]]:
        try:
            served, held, named = await _member_strays(member, foreign, timeout_s)
        except EndpointError as exc:
            logger.warning("%s: keys outside its shard's slots not counted: %s", member.name, exc)
            return []
        by_server: dict[str, list[int]] = {}
        for slot in held:
            by_server.setdefault(served.get(slot, "no node"), []).append(slot)
        rows = []
        for address, slots in sorted(by_server.items()):
            examples = [k for s in sorted(slots) for k in named.get(s, [])][:EXAMPLES]
            rows.append(
                {
                    "member": member.name,
                    "keys": sum(held[s] for s in slots),
                    "slots": [list(r) for r in ranges(slots)],
                    "served_by": _group_of(topology, address),
                    "served_at": address,
                    "examples": [key_to_json(k) for k in examples],
                }
            )
        return rows

    found = await all_of(one(m) for m in members)
    return [row for rows in found for row in rows]
