"""The compare-and-write steps of a repair on one connection, made here or by a region's agent.

`read_for_copy` (step 1 on the winner) and `compare_and_write` (step 2 on a
target) each WATCH the key, require the state the decision saw, and run their
commands in MULTI/EXEC, so a write replaces exactly the compared state (the
safety argument is in `apply`). A `Write` (`keyspace.write`) is such a write as data: an agent
receives it over HTTP and computes its TTL when it writes. `typed_writes`
rebuild a value for a server that refuses the winner's DUMP format.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from replag.errors import EndpointError, KeyRefused
from replag.repair.keyspace.field_ttls import field_expiry_writes
from replag.repair.keyspace.observe import KeyState, observe_keys
from replag.repair.keyspace.timeouts import DUMP_OVERHEAD, NOT_COPIED, request_within
from replag.repair.keyspace.values import Data, StreamEntry
from replag.repair.writes.undo import collection_data
from replag.wire.reply_limits import size_text
from replag.wire.resp import RespConnection, error_text, pack


@dataclass(frozen=True)
class Refused:
    """A server refused a read or write of this key: which replica, and what it said."""

    replica: str
    message: str

    def __str__(self) -> str:
        return f"{self.replica} refused: {self.message}"


CHUNK = 1000


def raise_refusal(conn: RespConnection, replies: Sequence[Any]) -> None:
    """KeyRefused (naming the replica) for the most telling error among a transaction's
    replies, the EXEC result's elements included: a queued command's own refusal
    (READONLY, NOPERM, OOM) rather than the EXECABORT it causes."""
    flat: list[Any] = []
    for reply in replies:
        flat.extend(reply if isinstance(reply, list) else [reply])
    errors = [text for reply in flat if (text := error_text(reply)) is not None]
    if errors:
        telling = next((e for e in errors if not e.startswith("EXECABORT")), errors[0])
        raise KeyRefused(telling, where=conn.endpoint.name)


async def read_for_copy(
    conn: RespConnection, key: bytes, expected: KeyState, *, tolerance_ms: int, chunk: int
) -> tuple[bytes, int] | None:
    """Step 1 on the winner: (DUMP, PTTL) if the key still holds `expected`, else None."""
    read, _ = await read_for_copy_with_data(
        conn, key, expected, tolerance_ms=tolerance_ms, chunk=chunk, collect=False
    )
    return read


async def read_for_copy_with_data(
    conn: RespConnection,
    key: bytes,
    expected: KeyState,
    *,
    tolerance_ms: int,
    chunk: int,
    collect: bool = True,
) -> tuple[tuple[bytes, int] | None, Data | None]:
    """`read_for_copy`, and (`collect`) the elements of a hash, set or sorted set of at
    most `undo.MERGE_LIMIT` elements, read under the same WATCH: of the same moment as
    the DUMP."""
    conn.check(await conn.request(pack(b"WATCH", key), 1))
    now = await observe_keys(conn, [key], chunk=chunk, keep=False)
    if not now[key].same_as(expected, tolerance_ms):
        conn.check(await conn.request(pack(b"UNWATCH"), 1))
        return None, None
    await _dump_fits(conn, key, now[key])
    data = await collection_data(conn, key, expected, chunk) if collect else None
    replies = await request_within(
        conn,
        pack(b"MULTI") + pack(b"DUMP", key) + pack(b"PTTL", key) + pack(b"EXEC"),
        4,
        base_s=conn.timeout_s,
        what=f"DUMP of {key!r}",
    )
    raise_refusal(conn, replies)
    result = replies[3]
    if result is None or not isinstance(result[0], bytes):
        return None, None  # the winner changed after we read it
    return (result[0], int(result[1])), data


async def compare_and_write(
    conn: RespConnection,
    key: bytes,
    expected: KeyState,
    commands: Callable[[], list[bytes] | None],
    *,
    tolerance_ms: int,
    chunk: int,
) -> tuple[bytes | None, int, int] | None:
    """Step 2 on a target: under WATCH, if the key still holds `expected`, run `commands()`
    in MULTI/EXEC after a DUMP and PTTL of what they replace. (pre-image or None for no
    key, its PTTL, commands run), or None if nothing was written.

    `commands` is called once the connection is ours, so a TTL in it is computed at the
    moment of writing; it returns None when there is nothing valid left to write.
    """
    conn.check(await conn.request(pack(b"WATCH", key), 1))
    now = await observe_keys(conn, [key], chunk=chunk, keep=False)
    if not now[key].same_as(expected, tolerance_ms):
        conn.check(await conn.request(pack(b"UNWATCH"), 1))
        return None
    await _dump_fits(conn, key, now[key])
    built = commands()
    if built is None:
        conn.check(await conn.request(pack(b"UNWATCH"), 1))
        return None
    body = [pack(b"MULTI"), pack(b"DUMP", key), pack(b"PTTL", key), *built, pack(b"EXEC")]
    try:
        replies = await request_within(
            conn, b"".join(body), len(body), base_s=conn.timeout_s, what=f"writing {key!r}"
        )
    except KeyRefused as exc:
        if not isinstance(exc.__cause__, EndpointError):
            raise
        # The EXEC ran, but its reply (the pre-image's DUMP: a collection too big for one
        # reply) was refused: written, and not undoable if a client wrote meanwhile.
        raise KeyRefused(
            f"{exc.message.removesuffix(NOT_COPIED)}; the write ran, but what it replaced "
            "was not kept, so it is not re-verified or undone",
            where=exc.where,
        ) from exc
    # A refusal (READONLY, NOPERM, OOM: EXECABORT; a RESTORE's bad payload inside EXEC)
    # is this key's error, not the run's.
    raise_refusal(conn, replies)
    result = replies[-1]
    if result is None:
        return None
    pre_image = result[0] if isinstance(result[0], bytes) else None
    return pre_image, int(result[1]), len(built)


async def _dump_fits(conn: RespConnection, key: bytes, now: KeyState) -> None:
    """A string too long for its DUMP to pass max_reply_bytes in one reply: that key's
    error, named, before anything is read or written (the connection stays usable)."""
    limit = conn.endpoint.limits.max_bytes
    if now.size is None or now.size + DUMP_OVERHEAD <= limit:
        return
    conn.check(await conn.request(pack(b"UNWATCH"), 1))
    raise KeyRefused(
        f"{key!r} is a string of {now.size} bytes: its DUMP would pass max_reply_bytes = "
        f"{size_text(limit)}{NOT_COPIED}",
        where=conn.endpoint.name,
    )


# The types `typed_writes` rebuilds; any other (a vector set, a module's type) is copied
# by DUMP/RESTORE alone, and not at all where the target cannot load its payload.
TYPED_WRITES = ("string", "hash", "set", "zset", "list", "stream")


def cannot_restore(key: bytes, type_name: str, refusal: str) -> str:
    """Why `key`, a `type_name` value, was not copied: the target refused its RESTORE (a
    server without the type: Valkey, an older Redis, a module not loaded) and no other
    write rebuilds it whole (a repair never writes a value it could not read whole)."""
    return (
        f"{key!r} is a {type_name} value and the target cannot load it ({refusal}): "
        f"not copied (only DUMP/RESTORE copies a {type_name} whole; a server that has "
        "the type, or loads its module, can take it)"
    )


def typed_writes(key: bytes, state: KeyState) -> list[bytes]:
    """Commands rebuilding `state`'s value without DUMP/RESTORE."""
    data: Any = state.data
    out = [pack(b"DEL", key)]
    if state.type == "string":
        out.append(pack(b"SET", key, data))
    elif state.type == "hash":
        items = list(data.items())
        for i in range(0, len(items), CHUNK):
            out.append(pack(b"HSET", key, *[x for pair in items[i : i + CHUNK] for x in pair]))
        if state.field_expiries is not None:
            out += field_expiry_writes(key, state.field_expiries.items())
    elif state.type == "set":
        members = list(data)
        for i in range(0, len(members), CHUNK):
            out.append(pack(b"SADD", key, *members[i : i + CHUNK]))
    elif state.type == "zset":
        items = [(repr(score).encode(), member) for member, score in data.items()]
        for i in range(0, len(items), CHUNK):
            out.append(pack(b"ZADD", key, *[x for pair in items[i : i + CHUNK] for x in pair]))
    elif state.type == "list":
        for i in range(0, len(data), CHUNK):
            out.append(pack(b"RPUSH", key, *data[i : i + CHUNK]))
    elif state.type == "stream":
        entries: Sequence[StreamEntry] = data
        out.extend(pack(b"XADD", key, entry_id, *fields) for entry_id, fields in entries)
    return out


def elapsed_ms(since: float) -> int:
    """Milliseconds since `since` (monotonic): a copy's TTL is the source's less this."""
    return int((time.monotonic() - since) * 1000)
