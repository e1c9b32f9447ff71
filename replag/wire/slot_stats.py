"""CLUSTER SLOT-STATS: a Cluster node's key count per slot, in one call (Valkey 8+, Redis 8.2+).

`CLUSTER SLOT-STATS SLOTSRANGE 0 16383` answers, for each slot the node's shard serves
(a replica: its primary's), `[slot, {key-count: N, ...}]` (a map under RESP3, a flat
field/value array under RESP2; Valkey adds cpu-usec and network bytes where
`cluster-slot-stats-enabled` is on). A slot the shard does not serve is not listed,
whatever the range asked: keys left in such slots (`repair.stray_slots`) are not
counted here.

`read_counts` reads it with the node's replication offset in one transaction (MULTI:
nothing runs between the two), so a primary's counts and a replica's can be compared
at one point of the replication stream. A server without the command answers an
unknown-subcommand error: `SlotCounts.missing` says so, and callers go without.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replag.wire import shapes
from replag.wire.resp import RespConnection, check_replies, error_text, pack

SLOTS = shapes.CLUSTER_SLOTS
COMMAND = (b"CLUSTER", b"SLOT-STATS", b"SLOTSRANGE", b"0", b"%d" % (SLOTS - 1))
KEY_COUNT = shapes.KEY_COUNT


@dataclass
class SlotCounts:
    """One node's key count per slot its shard serves, and its replication offset then
    (`master_repl_offset` on a primary, the applied stream's on a replica)."""

    counts: dict[int, int] = field(default_factory=dict)
    offset: int | None = None
    missing: str | None = None  # the server has no CLUSTER SLOT-STATS: its answer


def parse_counts(reply: list[Any]) -> dict[int, int]:
    """Slot → key count, from a reply whose shape was checked (`shapes`)."""
    count = shapes.slot_key_count
    return {slot: count(fields) for slot, fields in reply}


def _offset(info: Any, replica: bool) -> int | None:
    if not isinstance(info, bytes):
        return None
    name = b"slave_repl_offset:" if replica else b"master_repl_offset:"
    for line in info.splitlines():
        if line.startswith(name):
            value = line[len(name) :].strip()
            return int(value) if value.lstrip(b"-").isdigit() else None
    return None


def unknown_command(reply: Any) -> str | None:
    """The server's words when `reply` says it has no CLUSTER SLOT-STATS, else None."""
    text = error_text(reply)
    if text is None:
        return None
    lowered = text.lower()
    if "unknown subcommand" in lowered or "unknown command" in lowered:
        return text
    return None


async def read_counts(conn: RespConnection, *, replica: bool) -> SlotCounts:
    """The node's slot counts and its offset at one moment (see the module docstring).
    A refusal (NOPERM) or another error reply raises, naming the server; a server
    without the command gives `missing`."""
    replies = await conn.request(
        pack(b"MULTI") + pack(b"INFO", b"replication") + pack(*COMMAND) + pack(b"EXEC"), 4
    )
    queued = replies[1:3]
    for reply in queued:
        said = unknown_command(reply)
        if said is not None:
            return SlotCounts(missing=said)
    check_replies(replies[:3], conn.endpoint, command="CLUSTER SLOT-STATS")
    executed = replies[3]
    check_replies([executed], conn.endpoint, command="CLUSTER SLOT-STATS")
    if not isinstance(executed, list) or len(executed) != 2:
        expected = "the replies of INFO and CLUSTER SLOT-STATS"
        raise shapes.wrong(conn.endpoint, "EXEC", expected, executed)
    info, stats = executed
    said = unknown_command(stats)  # Redis 6.2 queues it and refuses it at EXEC
    if said is not None:
        return SlotCounts(missing=said)
    check_replies([info, stats], conn.endpoint, command="CLUSTER SLOT-STATS")
    shapes.check(conn.endpoint, (b"INFO",), info)
    shapes.check(conn.endpoint, COMMAND, stats)
    return SlotCounts(counts=parse_counts(stats), offset=_offset(info, replica))
