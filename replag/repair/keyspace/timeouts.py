"""Repair commands' own timeout: `repair_command_timeout`, plus 1 s per 10 MB carried.

A RESTORE of a 15 MB value can take seconds; held to `connect_timeout` it failed
after its write had landed, naming neither the key nor the setting. Every bulk or
page command goes through `request_within`, whose timeout scales with the bytes it
sends, and whose failure says which key, which replica and which setting.
"""

from __future__ import annotations

from typing import Any

from replag.errors import KeyRefused, RepairError, UnreachableError
from replag.wire.reply_limits import ReplyLimitError
from replag.wire.resp import RespConnection

BYTES_PER_SECOND = 10_000_000
# A DUMP's bytes beyond a string's own (type, length, version, checksum) and its reply's
# framing with the PTTL beside it in MULTI/EXEC, generously.
DUMP_OVERHEAD = 256
# How a value over max_reply_bytes ends its per-key error.
NOT_COPIED = "; not repaired (a value this big is copied only with a higher max_reply_bytes)"


def command_timeout(base_s: float, payload_bytes: int) -> float:
    return base_s + payload_bytes / BYTES_PER_SECOND


async def request_within(
    conn: RespConnection, payload: bytes, count: int, *, base_s: float, what: str
) -> list[Any]:
    """`conn.request` within `command_timeout(base_s, len(payload))`; a timeout is a
    RepairError naming `what` (the key or keys), the replica and the setting. A reply over
    max_reply_bytes (a DUMP of a value too big for one reply) is that key's error
    (`KeyRefused`, naming it, the replica and the setting): the run goes on without it,
    on a new connection (this one is closed)."""
    timeout_s = command_timeout(base_s, len(payload))
    try:
        return await conn.request(payload, count, timeout_s)
    except UnreachableError as exc:
        if isinstance(exc.__cause__, ReplyLimitError):
            raise KeyRefused(
                f"{what}: {exc.message}{NOT_COPIED}",
                where=conn.endpoint.name,
            ) from exc
        if not exc.message.startswith("timed out"):
            raise
        size = f"{len(payload) / 1e6:.1f} MB" if len(payload) >= 100_000 else f"{len(payload)} B"
        raise RepairError(
            f"{what}: no answer within {timeout_s:.1f} s ({size} sent; "
            f"repair_command_timeout is {base_s:g} s plus 1 s per 10 MB: raise it, e.g. "
            f"REPLAG_REPAIR_COMMAND_TIMEOUT=30s)",
            where=conn.endpoint.name,
        ) from exc
