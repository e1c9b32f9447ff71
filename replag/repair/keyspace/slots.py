"""Redis Cluster hash slots: which slot a key is in, and which slots moved while a group
was checked.

A group's slots may move while it is checked (a reshard, a failover elsewhere):
`SlotMap` reads which slots the group's nodes serve, and which are migrating
or importing, from `CLUSTER NODES` on each member, at the start and the end;
the slots that were not the group's throughout, and those of keys a member
answered MOVED or ASK for, are named as not compared (`not_compared`), and
nothing found in them is reported. A move marked on both ends during which no
key left the migrating node (its CLUSTER COUNTKEYSINSLOT the same at the start
and the end: a reshard interrupted, by a failover say, whose marks Valkey hands
to the new primaries) is stuck, not live (`stuck_moves`): its slot is compared.
On Valkey 9 the migrations `CLUSTER GETSLOTMIGRATIONS` lists as under way are
moving too (an atomic migration leaves no marks). A member that now replicates a
node outside the group (a shard emptied by a migration) is a topology change
(`topology_change`): the group is no longer what the config says.
`slot_groups` gives a scan batch's keys by slot, for one MGET per slot where SCAN
walks dense slots in order (see `scan`).
"""

from __future__ import annotations

import binascii
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from replag.errors import EndpointError
from replag.repair.keyspace.slot_migrations import SlotMigration, parse_migrations
from replag.repair.keyspace.together import all_of
from replag.topology import Endpoint
from replag.wire.reach import Reach
from replag.wire.resp import RespConnection, error_text, pack

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


@dataclass(frozen=True)
class Move:
    """A slot's move marked on both ends: from `migrating` to `importing` (host:port)."""

    migrating: str
    importing: str
    source_id: str  # the migrating node's id
    target_id: str  # the importing node's


@dataclass
class SlotMap:
    """The slots a group's nodes serve, those migrating to or importing from elsewhere,
    and marks left behind with no move under way (`stale`: slot → the node holding it)."""

    owned: set[int] = field(default_factory=set)
    moving: set[int] = field(default_factory=set)
    stale: dict[int, str] = field(default_factory=dict)
    # Slots of `moving` marked on two primaries: slot → the move.
    moves: dict[int, Move] = field(default_factory=dict)
    # (node id, slot) → that node's CLUSTER COUNTKEYSINSLOT, for each slot it marks.
    keys: dict[tuple[str, int], int] = field(default_factory=dict)
    # Each answering member (host:port): its node id, the primary it replicates (node id;
    # primaries absent), the slots its own line marks importing.
    ids: dict[str, str] = field(default_factory=dict)
    follows: dict[str, str] = field(default_factory=dict)
    importing: dict[str, set[int]] = field(default_factory=dict)
    # Node id → host:port, of every node a member lists.
    where: dict[str, str] = field(default_factory=dict)
    # Valkey 9 atomic slot migrations the members list (CLUSTER GETSLOTMIGRATIONS).
    migrations: list[SlotMigration] = field(default_factory=list)
    # Reads a member refused (NOPERM): what this map says is then not the whole truth.
    refused: list[str] = field(default_factory=list)

    @classmethod
    def parse(
        cls,
        texts: Sequence[str],
        addresses: set[str],
        peers: Mapping[str, str] | None = None,
    ) -> SlotMap:
        """From `CLUSTER NODES` of each member: slots of the nodes at `addresses`
        (host:port), and the migrating/importing slots of each node's own line.

        A mark is a move under way only when both ends hold it: the primary marking a
        slot migrating to P (importing from P), and P, a live primary, marking it importing
        from (migrating to) that very node, as `peers` (node id → its CLUSTER NODES) shows
        where given. Anything else is stale: its slot is compared, and the mark named
        (Valkey replicates SETSLOT MIGRATING to replicas, and a move ended with SETSLOT
        NODE on the primaries, or a failover that gave the slot a new primary, leaves
        marks no move will ever clear). A replica's mark follows its primary's."""
        out = cls()
        primaries: set[str] = set()
        primary_of: dict[str, str] = {}
        marks = _marks(texts)
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
                if address in addresses:
                    for item in parts[8:]:
                        if not item.startswith("["):
                            first, _, last = item.partition("-")
                            out.owned.update(range(int(first), int(last or first) + 1))
        theirs = {m for text in (peers or {}).values() for m in _marks([text])}
        where = _addresses([*texts, *(peers or {}).values()])

        def live(node: str, slot: int, way: str, peer: str) -> bool:
            if peer not in primaries:
                return False
            if peers is None or (not any(m[0] == peer for m in theirs) and peer not in peers):
                return True  # the other end unread: taken as a move, not compared
            back = "<" if way == ">" else ">"
            return any(m[0] == peer and m[2:] == (slot, back, node) for m in theirs)

        on_primaries = {
            (m[0], m[2]): live(m[0], m[2], m[3], m[4]) for m in marks if m[0] not in primary_of
        }
        for node, address, slot, way, peer in marks:
            if node in primary_of:  # a replica: as its primary's mark of the slot
                moving = on_primaries.get((primary_of[node], slot), False)
            else:
                moving = on_primaries[(node, slot)]
                if moving and peer in where:
                    other = "{}:{}".format(*where[peer])
                    out.moves[slot] = (
                        Move(address, other, node, peer)
                        if way == ">"
                        else Move(other, address, peer, node)
                    )
            if moving:
                out.moving.add(slot)
            else:
                out.stale.setdefault(slot, address)
        for slot in out.moving:
            out.stale.pop(slot, None)
        for _, address, slot, way, _ in marks:
            if way == "<" and address in addresses:
                out.importing.setdefault(address, set()).add(slot)
        for text in texts:
            for line in text.splitlines():
                parts = line.split()
                if len(parts) >= 8 and "myself" in parts[2].split(","):
                    address = parts[1].split("@", 1)[0].split(",", 1)[0]
                    out.ids[address] = parts[0]
                    if "slave" in parts[2].split(",") and parts[3] != "-":
                        out.follows[address] = parts[3]
        out.where = {node: f"{h}:{p}" for node, (h, p) in where.items()}
        return out

    def topology_change(self) -> str | None:
        """Why the group's members are no longer one shard as configured (None: they
        are): a member replicating a node outside the group (Valkey turns a primary whose
        slots all moved away into a replica of their new owner), or no slot served by any
        member that answered."""
        if not self.ids:
            return None
        mine = set(self.ids.values())
        for address, primary in sorted(self.follows.items()):
            if primary not in mine:
                other = self.where.get(primary, primary)
                return f"{address} now replicates {other}, a node outside this group"
        if not self.owned:
            return "its nodes serve no slots now (they all moved to other shards)"
        return None

    def live_migrations(self) -> set[int]:
        return {s for m in self.migrations if m.live for s in m.slot_set()}

    @classmethod
    async def read(
        cls, members: Sequence[Endpoint], *, timeout_s: float, reach: Reach | None = None
    ) -> SlotMap:
        """CLUSTER NODES of every member that answers, and of each node outside the group
        that a member's mark names (the other end of a move, to tell a live one) if
        `reach` admits it (the topology names it, or it is inside allow_networks): one
        that it does not is not contacted, and listed in `refused`. No `reach`: only the
        members are asked."""
        like = members[0] if members else None

        keys: dict[tuple[str, int], int] = {}
        refused: list[str] = []
        migrations: dict[str, SlotMigration] = {}

        def refusal(member: Endpoint, command: str, reply: object) -> bool:
            text = error_text(reply)
            if text is not None and text.startswith("NOPERM"):
                refused.append(f"{command} on {member.name}: {text}")
                return True
            return False

        async def nodes(member: Endpoint) -> str:
            """Its CLUSTER NODES, its count of keys in each slot it marks, and (Valkey 9)
            the slot migrations it lists."""
            try:
                conn = await RespConnection.open(member, timeout_s=timeout_s)
            except EndpointError:
                return ""
            try:
                reply, info = await conn.request(
                    pack(b"CLUSTER", b"NODES") + pack(b"INFO", b"server"), 2
                )
                if refusal(member, "CLUSTER NODES", reply):
                    return ""
                text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else ""
                mine = _marks([text])
                marked = sorted({m[2] for m in mine})
                if marked:
                    counts = await conn.request(
                        b"".join(pack(b"CLUSTER", b"COUNTKEYSINSLOT", b"%d" % s) for s in marked),
                        len(marked),
                    )
                    for slot, count in zip(marked, counts, strict=True):
                        if isinstance(count, int):
                            keys[(mine[0][0], slot)] = count
                        else:
                            refusal(member, "CLUSTER COUNTKEYSINSLOT", count)
                if _valkey_major(info) >= 9:
                    (listed,) = await conn.request(pack(b"CLUSTER", b"GETSLOTMIGRATIONS"), 1)
                    if not refusal(member, "CLUSTER GETSLOTMIGRATIONS", listed):
                        for m in parse_migrations(listed):
                            # A replica lists its primary's migration without its ends.
                            if m.source or m.name not in migrations:
                                migrations[m.name] = m
            except EndpointError:
                return ""
            finally:
                await conn.close()
            return text

        texts = await all_of(nodes(m) for m in members)
        wanted = {m[4] for m in _marks(texts)}
        where = _addresses(texts)
        peers: dict[str, str] = {}
        if like is not None and wanted:
            asked = []
            for p in sorted(wanted):
                if p not in where:
                    continue
                host, port = where[p]
                why = reach.outside(host, port) if reach is not None else "no reach given"
                if why is None:
                    asked.append(p)
                    continue
                named_by = ", ".join(m.name for m in members)
                shown = reach.setting_text() if reach is not None else "allow_networks unread"
                refused.append(
                    f"CLUSTER NODES of {host}:{port} (the other end of a slot move {named_by} "
                    f"marked): not contacted, no credentials sent ({why}, and {shown})"
                )
            found = await all_of(
                nodes(dataclasses.replace(like, host=where[p][0], port=where[p][1])) for p in asked
            )
            peers = {p: text for p, text in zip(asked, found, strict=True) if text}
        out = cls.parse(texts, {m.address for m in members}, peers)
        out.keys, out.refused = keys, refused
        ids = set(out.ids.values())
        out.migrations = sorted(
            (m for m in migrations.values() if ids & {m.source, m.target}), key=lambda m: m.name
        )
        moving = out.live_migrations()
        out.moving |= moving
        for slot in moving:
            out.stale.pop(slot, None)
        return out


def _valkey_major(info: object) -> int:
    """Valkey's major version from INFO server (0: not Valkey, or unreadable)."""
    if not isinstance(info, bytes):
        return 0
    for line in info.decode("utf-8", "replace").splitlines():
        if line.startswith("valkey_version:"):
            major = line.split(":", 1)[1].split(".", 1)[0].strip()
            return int(major) if major.isdigit() else 0
    return 0


def _marks(texts: Sequence[str]) -> list[tuple[str, str, int, str, str]]:
    """(node id, address, slot, ">" migrating | "<" importing, peer id) of each node's own
    line's marks."""
    out = []
    for text in texts:
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 8 or "myself" not in parts[2].split(","):
                continue
            address = parts[1].split("@", 1)[0].split(",", 1)[0]
            for item in parts[8:]:
                if item.startswith("["):
                    # [slot->-id] migrating, [slot-<-id] importing
                    number, _, rest = item[1:-1].partition("-")
                    out.append((parts[0], address, int(number), rest[:1], rest[2:]))
    return out


def _addresses(texts: Sequence[str]) -> dict[str, tuple[str, int]]:
    """Node id → (host, port), from any CLUSTER NODES text."""
    out = {}
    for text in texts:
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 8:
                continue
            host, _, port = parts[1].split("@", 1)[0].split(",", 1)[0].rpartition(":")
            if host and port.isdigit():
                out[parts[0]] = (host, int(port))
    return out


def stuck_moves(before: SlotMap, after: SlotMap) -> dict[int, Move]:
    """Moves marked on both ends, between the same two primaries, at the start and the
    end of the run, during which the migrating node's count of keys in the slot did not
    change: no key moved (MIGRATE only takes keys away from it, and it creates none in a
    migrating slot), so its shard's keys there held still and are compared."""
    out = {}
    for slot, move in before.moves.items():
        if after.moves.get(slot) != move:
            continue
        first = before.keys.get((move.source_id, slot))
        if first is not None and first == after.keys.get((move.source_id, slot)):
            out[slot] = move
    return out


def not_compared(before: SlotMap, after: SlotMap) -> set[int]:
    """Slots a check of the group cannot vouch for: served by it at only one end of the
    run, or migrating or importing at either end, unless the move was stuck throughout."""
    moving = (before.moving | after.moving) - stuck_moves(before, after).keys()
    return (before.owned ^ after.owned) | moving
