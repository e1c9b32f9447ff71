"""Putting a target back when the winner moved before its repair stood.

The target held P (its pre-image, read in the repair's own transaction); the
repair wrote X; it now holds N. In one WATCH/MULTI/EXEC on the target, N
compared by digest:

- N is X: RESTORE P, or DEL when it had no key. Exact.
- N is gone, of another type, or a string with another value: a client
  deleted or overwrote the key after the repair: N stays.
- N has X's value with another expiry: a client set it (EXPIRE, PERSIST):
  P, then that expiry.
- a hash, set or sorted set whose elements differ from X, with X's elements
  kept (up to `MERGE_LIMIT`): clients changed some elements of the copy
  (HSET, HDEL, SADD, ZADD…) before it could be undone. P, then exactly those
  changes, then N's expiry if it moved: what the key would hold had those
  writes met P instead of the copy.
- anything else (a list or stream changed in place, a collection too large to
  have kept X's elements) cannot be separated: reported, never guessed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from replag.repair.keyspace.observe import KeyState, observe_keys
from replag.repair.keyspace.values import Data, read_values
from replag.wire.resp import RespConnection, pack

# Elements of a copied collection kept (until the copy stands or is undone) to merge an
# undo with: repairs in flight hold at most this many each (max_inflight per replica).
MERGE_LIMIT = 10_000
MERGEABLE = ("hash", "set", "zset")
_CHUNK = 1000

Undo = Literal["restored", "merged", "client_wrote", "failed"]


@dataclass
class PreImage:
    """What a target held just before a repair wrote it (from the same transaction)."""

    type: str | None  # None: no key
    dump: bytes | None
    pttl: int
    at: float  # monotonic time of the write

    def restore(self, key: bytes) -> list[bytes]:
        if self.dump is None:
            return [pack(b"DEL", key)]
        ttl = 0  # RESTORE's "no expiry"
        if self.pttl >= 0:
            ttl = self.pttl - int((time.monotonic() - self.at) * 1000)
            if ttl <= 0:  # it would have expired by now
                return [pack(b"DEL", key)]
        return [pack(b"RESTORE", key, ttl, self.dump, b"REPLACE")]


def element_changes(key: bytes, kind: str, ours: Any, now: Any) -> list[bytes]:
    """Commands that apply to another value of `key` the changes that turned `ours` into
    `now` (both a hash's dict, a set, or a sorted set's member → score dict)."""
    out: list[bytes] = []
    if kind == "set":
        added, removed = sorted(now - ours), sorted(ours - now)
        out += [pack(b"SADD", key, *added)] if added else []
        out += [pack(b"SREM", key, *removed)] if removed else []
        return out
    changed = [(k, v) for k, v in now.items() if ours.get(k) != v]
    removed = [k for k in ours if k not in now]
    if changed and kind == "hash":
        out.append(pack(b"HSET", key, *[x for pair in changed for x in pair]))
    elif changed:
        out.append(pack(b"ZADD", key, *[x for k, v in changed for x in (repr(v), k)]))
    if removed:
        out.append(pack(b"HDEL" if kind == "hash" else b"ZREM", key, *removed))
    return out


def _expiry_commands(key: bytes, now: KeyState) -> list[bytes]:
    if now.expiry_ms is None:
        return [pack(b"PERSIST", key)]
    left = now.expiry_ms - time.time_ns() // 1_000_000
    return [pack(b"PEXPIRE", key, max(left, 1))]


def overwritten(now: KeyState, wrote: KeyState) -> bool:
    """Whether a client deleted or overwrote the repair's copy: the key is gone, of
    another type, or a string with another value (taken as a SET: APPEND, SETRANGE and
    INCR on the copy cannot be told from one, and are rare on keys whose replicas
    differ). Such a write stays; nothing of the copy is left in it."""
    return (
        not now.exists
        or now.type != wrote.type
        or (now.type == "string" and not now.same_value(wrote))
    )


async def undo(
    conn: RespConnection,
    key: bytes,
    *,
    wrote: KeyState,
    wrote_data: Data | None,
    before: PreImage,
    tolerance_ms: int,
    chunk: int = _CHUNK,
) -> Undo:
    """Put `key` back on the target behind `conn` (see the module docstring)."""
    conn.check(await conn.request(pack(b"WATCH", key), 1))
    now = (await observe_keys(conn, [key], chunk=chunk, keep=False))[key]
    commands: list[bytes] | None = None
    outcome: Undo = "merged"
    if now.same_as(wrote, tolerance_ms):
        commands, outcome = before.restore(key), "restored"
    elif overwritten(now, wrote):
        outcome = "client_wrote"
    elif now.readable:
        expiry = [] if now.same_expiry(wrote, tolerance_ms) else _expiry_commands(key, now)
        if now.same_value(wrote):
            commands = before.restore(key) + expiry
        elif now.type in MERGEABLE and wrote_data is not None:
            commands = await _merged(conn, key, now, wrote_data, before, chunk)
            commands = None if commands is None else commands + expiry
    if commands is None:
        conn.check(await conn.request(pack(b"UNWATCH"), 1))
        return outcome if outcome == "client_wrote" else "failed"
    body = [pack(b"MULTI"), *commands, pack(b"EXEC")]
    replies = await conn.request(b"".join(body), len(body))
    conn.check(replies[:1])
    if replies[-1] is None:
        return "failed"  # moved again meanwhile
    conn.check(replies[-1])
    return outcome


async def _merged(
    conn: RespConnection,
    key: bytes,
    now: KeyState,
    ours: Data,
    before: PreImage,
    chunk: int,
) -> list[bytes] | None:
    """P, then the element changes clients made to our copy; None if they cannot be read."""
    assert now.type is not None
    read = (await read_values(conn, [(key, now.type)], chunk=chunk, keep=True))[key]
    if read is None or read.digest != now.digest:
        return None
    changes = element_changes(key, now.type, ours, read.data)
    if before.type not in (None, now.type):
        # The clients' element writes would have failed on P's type (WRONGTYPE): P alone.
        changes = []
    return before.restore(key) + changes


async def collection_data(
    conn: RespConnection, key: bytes, state: KeyState, chunk: int = _CHUNK
) -> Data | None:
    """The elements of a hash, set or sorted set of at most MERGE_LIMIT elements, read on
    `conn` (inside the caller's WATCH); None for other types, larger ones, or a key that
    no longer has `state`'s digest."""
    if state.type not in MERGEABLE:
        return None
    card = {"hash": b"HLEN", "set": b"SCARD", "zset": b"ZCARD"}[state.type]
    (size,) = await conn.request(pack(card, key), 1)
    if not isinstance(size, int) or size > MERGE_LIMIT:
        return None
    read = (await read_values(conn, [(key, state.type)], chunk=chunk, keep=True))[key]
    return read.data if read is not None and read.digest == state.digest else None


__all__ = [
    "MERGE_LIMIT",
    "PreImage",
    "Undo",
    "collection_data",
    "element_changes",
    "overwritten",
    "undo",
]
