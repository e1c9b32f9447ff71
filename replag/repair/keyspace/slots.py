"""Redis Cluster hash slots: which slot a key is in, and which slots moved while a group
was checked.

A group's slots may move while it is checked (a reshard, a failover elsewhere):
`SlotMap` reads which slots the group's nodes serve, and which are migrating
or importing, from `CLUSTER NODES` on each member, at the start and the end;
the slots that were not the group's throughout, and those of keys a member
answered MOVED or ASK for, are named as not compared (`not_compared`), and
nothing found in them is reported. `slot_groups` gives a scan batch's keys by
slot, for one MGET per slot where SCAN walks dense slots in order (see `scan`).
"""

from __future__ import annotations

import binascii
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from replag.errors import EndpointError
from replag.repair.keyspace.together import all_of
from replag.resp import RespConnection, error_text, pack
from replag.topology import Endpoint

SLOTS = 16384
# Error replies saying a key is served elsewhere now (or, mid-migration, for now).
MOVED_ERRORS = ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN")


def key_slot(key: bytes) -> int:
    """The key's hash slot: CRC16 (XMODEM, as binascii.crc_hqx) of its hash tag or name."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key, 0) & (SLOTS - 1)


def slot_groups(keys: Sequence[bytes]) -> list[list[int]]:
    """Indexes of `keys` grouped by slot, groups in order of first appearance."""
    groups: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key_slot(key), []).append(i)
    return list(groups.values())


def is_moved(reply: object) -> bool:
    """A MOVED/ASK/TRYAGAIN/CLUSTERDOWN error reply: the key is (being) served elsewhere."""
    text = error_text(reply)
    return text is not None and text.startswith(MOVED_ERRORS)


def ranges(slots: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted slots as inclusive ranges."""
    out: list[tuple[int, int]] = []
    for slot in sorted(set(slots)):
        if out and out[-1][1] == slot - 1:
            out[-1] = (out[-1][0], slot)
        else:
            out.append((slot, slot))
    return out


def ranges_text(slots: Iterable[int]) -> str:
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges(slots))


@dataclass
class SlotMap:
    """The slots a group's nodes serve, those migrating to or importing from elsewhere,
    and marks left behind with no move under way (`stale`: slot → the node holding it)."""

    owned: set[int] = field(default_factory=set)
    moving: set[int] = field(default_factory=set)
    stale: dict[int, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, texts: Sequence[str], addresses: set[str]) -> SlotMap:
        """From `CLUSTER NODES` of each member: slots of the nodes at `addresses`
        (host:port), and the migrating/importing slots of each node's own line.

        A mark is stale, not a move, when it names a node that is not a live primary, or
        sits on a replica whose primary has none for that slot (Valkey replicates
        SETSLOT MIGRATING to replicas; a move ended with SETSLOT NODE on the primaries,
        or a failover, can leave the mark there for ever). Its slot is compared."""
        out = cls()
        primaries: set[str] = set()
        primary_of: dict[str, str] = {}
        marks: list[tuple[str, str, int, str]] = []  # node id, address, slot, peer id
        for text in texts:
            for line in text.splitlines():
                parts = line.split()
                if len(parts) < 8:
                    continue
                node, flags = parts[0], parts[2].split(",")
                address = parts[1].split("@", 1)[0].split(",", 1)[0]
                if "master" in flags and not {"fail", "fail?", "noaddr"} & set(flags):
                    primaries.add(node)
                if "slave" in flags and parts[3] != "-":
                    primary_of[node] = parts[3]
                mine = address in addresses
                for item in parts[8:]:
                    if item.startswith("["):
                        # [slot->-id] migrating, [slot-<-id] importing: on the node's own line.
                        if "myself" in flags:
                            number, _, peer = item[1:-1].partition("-")
                            marks.append((node, address, int(number), peer[2:]))
                    elif mine:
                        first, _, last = item.partition("-")
                        out.owned.update(range(int(first), int(last or first) + 1))
        marked = {(node, slot) for node, _, slot, _ in marks}
        for node, address, slot, peer in marks:
            primary = primary_of.get(node)
            orphan = primary is not None and (primary, slot) not in marked
            if peer not in primaries or orphan:
                out.stale.setdefault(slot, address)
            else:
                out.moving.add(slot)
        for slot in out.moving:
            out.stale.pop(slot, None)
        return out

    @classmethod
    async def read(cls, members: Sequence[Endpoint], *, timeout_s: float) -> SlotMap:
        """CLUSTER NODES of every member that answers."""

        async def nodes(member: Endpoint) -> str:
            try:
                conn = await RespConnection.open(member, timeout_s=timeout_s)
            except EndpointError:
                return ""
            try:
                (reply,) = await conn.request(pack(b"CLUSTER", b"NODES"), 1)
            except EndpointError:
                return ""
            finally:
                await conn.close()
            return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else ""

        texts = await all_of(nodes(m) for m in members)
        return cls.parse(texts, {m.address for m in members})


def not_compared(before: SlotMap, after: SlotMap) -> set[int]:
    """Slots a check of the group cannot vouch for: served by it at only one end of the
    run, or migrating or importing at either end."""
    return (before.owned ^ after.owned) | before.moving | after.moving
