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

A count is a moment, and slots keep moving after the check's last slot map (a
reshard into the shard brings keys before the shard serves their slot; a
replica applies its primary's deletions late): each candidate is confirmed
against slot maps read after it (`read_map`), the replica first caught up with
its primary's replication offset, and counted again in between; a slot the
shard serves or that moves at either confirming read is not a stray.

A stray on a primary is told apart by where it came from (`origin`): a slot
still marked importing there is a move into the shard that did not finish; a
primary that was a replica (INFO replication's `master_replid2` set: promoted)
inherited keys left on it as a replica, which its old primary deleted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from replag.errors import EndpointError, PermissionRefused
from replag.repair.keyspace.observe import key_to_json
from replag.repair.keyspace.slots import SLOTS, SlotMap, ranges
from replag.repair.keyspace.together import all_of
from replag.topology import Endpoint, Topology
from replag.wire.resp import RespConnection, check_replies, pack

logger = logging.getLogger(__name__)

EXAMPLES = 5  # keys named per member and serving group
# The longest a replica is waited for to apply what its primary did before a recount.
CATCH_UP_S = 5.0
NO_REPLID = "0" * 40


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


def _info_field(reply: object, name: str) -> str | None:
    if not isinstance(reply, bytes):
        return None
    for line in reply.decode("utf-8", "replace").splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return None


@dataclass
class _Held:
    """What one member holds in foreign slots, as last counted."""

    counts: dict[int, int] = field(default_factory=dict)
    named: dict[int, list[bytes]] = field(default_factory=dict)
    served: dict[int, str] = field(default_factory=dict)
    promoted: bool = False  # a primary that was a replica (master_replid2 set)


@dataclass
class StrayCheck:
    """The stray count of one group's members at the end of a check (see the module
    docstring); `refused` says which of its reads a member refused (NOPERM)."""

    topology: Topology
    members: Sequence[Endpoint]
    primary: Endpoint | None
    timeout_s: float
    settle_s: float
    read_map: Callable[[], Awaitable[SlotMap]]
    refused: list[str] = field(default_factory=list)
    maps: list[SlotMap] = field(default_factory=list)  # the confirming reads, in order

    async def find(
        self, owned: set[int], skip: set[int] | frozenset[int] = frozenset()
    ) -> list[dict[str, Any]]:
        """Per member and serving group: keys held in slots outside `owned` (the shard's)
        and `skip` (slots moving during the run), confirmed. Rows: member, keys, slots
        (ranges), served_by (group), served_at (its primary), examples (keys), origin."""
        foreign = [s for s in range(SLOTS) if s not in owned and s not in skip]
        if not foreign:
            return []
        first = await all_of(self._count(m, foreign, recount=False) for m in self.members)
        if not any(h is not None and h.counts for h in first):
            return []
        confirm = await self._confirming_map()
        offset = await self._primary_offset()
        later: list[_Held | None] = []
        for member, held in zip(self.members, first, strict=True):
            slots = [
                s
                for s in sorted(held.counts if held is not None else ())
                if s not in confirm.owned and s not in confirm.moving
            ]
            if not slots:
                later.append(None)
                continue
            if member != self.primary and offset is not None:
                await self._catch_up(member, offset)
            later.append(await self._count(member, slots, recount=True))
        last = await self._confirming_map()
        mine = {m.address for m in self.members}
        rows: list[dict[str, Any]] = []
        for member, held in zip(self.members, later, strict=True):
            if held is None:
                continue
            kept = {
                s: n
                for s, n in held.counts.items()
                if s not in last.owned and s not in last.moving and held.served.get(s) not in mine
            }
            rows += self._rows(member, held, kept, last)
        return rows

    async def _confirming_map(self) -> SlotMap:
        found = await self.read_map()
        self.refused += found.refused
        self.maps.append(found)
        return found

    def _rows(
        self, member: Endpoint, held: _Held, kept: dict[int, int], last: SlotMap
    ) -> list[dict[str, Any]]:
        by_server: dict[str, list[int]] = {}
        for slot in kept:
            by_server.setdefault(held.served.get(slot, "no node"), []).append(slot)
        on_primary = member == self.primary
        importing = last.importing.get(member.address, set())
        rows = []
        for address, slots in sorted(by_server.items()):
            examples = [k for s in sorted(slots) for k in held.named.get(s, [])][:EXAMPLES]
            if not on_primary:
                origin = "replica"
            elif importing & set(slots):
                origin = "unfinished_move"
            elif held.promoted:
                origin = "promoted"
            else:
                origin = "unknown"
            rows.append(
                {
                    "member": member.name,
                    "keys": sum(kept[s] for s in slots),
                    "slots": [list(r) for r in ranges(slots)],
                    "served_by": _group_of(self.topology, address),
                    "served_at": address,
                    "examples": [key_to_json(k) for k in examples],
                    "on_primary": on_primary,
                    "origin": origin,
                }
            )
        return rows

    async def _count(self, member: Endpoint, slots: list[int], *, recount: bool) -> _Held | None:
        """The member's keys in `slots` (those holding any; a recount also names a few,
        and reads who serves each slot and whether the member was promoted)."""
        try:
            conn = await RespConnection.open(member, timeout_s=self.timeout_s)
        except EndpointError as exc:
            logger.warning("%s: keys outside its shard's slots not counted: %s", member.name, exc)
            return None
        out = _Held()
        try:
            counts = await conn.request(
                b"".join(pack(b"CLUSTER", b"COUNTKEYSINSLOT", b"%d" % s) for s in slots),
                len(slots),
            )
            self._check(member, "CLUSTER COUNTKEYSINSLOT", counts)
            out.counts = {s: int(n) for s, n in zip(slots, counts, strict=True) if int(n) > 0}
            if recount and out.counts:
                asked = sorted(out.counts)
                replies = await conn.request(
                    pack(b"CLUSTER", b"SLOTS")
                    + pack(b"INFO", b"replication")
                    + b"".join(
                        pack(b"CLUSTER", b"GETKEYSINSLOT", b"%d" % s, b"%d" % EXAMPLES)
                        for s in asked
                    ),
                    len(asked) + 2,
                )
                self._check(member, "CLUSTER SLOTS", replies[:1])
                self._check(member, "CLUSTER GETKEYSINSLOT", replies[2:])
                out.served = slot_servers(replies[0])
                out.promoted = _info_field(replies[1], "master_replid2") not in (None, NO_REPLID)
                out.named = {s: list(r) for s, r in zip(asked, replies[2:], strict=True)}
        except PermissionRefused as exc:
            self.refused.append(str(exc))
            return None
        except EndpointError as exc:
            logger.warning("%s: keys outside its shard's slots not counted: %s", member.name, exc)
            return None
        finally:
            await conn.close()
        return out

    def _check(self, member: Endpoint, command: str, replies: list[Any]) -> None:
        check_replies(replies, member, command=command)

    async def _primary_offset(self) -> int | None:
        """The primary's replication offset now: what its replicas must have applied
        before their keys are counted again."""
        if self.primary is None:
            return None
        return await _offset(self.primary, "master_repl_offset", self.timeout_s)

    async def _catch_up(self, replica: Endpoint, offset: int) -> None:
        """Until `replica` has applied its primary's stream up to `offset` (or CATCH_UP_S,
        at least repair_settle: a replica that lags more is counted as it is)."""
        deadline = time.monotonic() + max(CATCH_UP_S, self.settle_s)
        while time.monotonic() < deadline:
            done = await _offset(replica, "slave_repl_offset", self.timeout_s)
            if done is None or done >= offset:
                return
            await asyncio.sleep(0.02)
        logger.warning("%s: not caught up with its primary before keys were counted", replica.name)


async def _offset(member: Endpoint, name: str, timeout_s: float) -> int | None:
    try:
        conn = await RespConnection.open(member, timeout_s=timeout_s)
    except EndpointError:
        return None
    try:
        (reply,) = await conn.request(pack(b"INFO", b"replication"), 1)
    except EndpointError:
        return None
    finally:
        await conn.close()
    value = _info_field(reply, name)
    return int(value) if value is not None and value.lstrip("-").isdigit() else None
