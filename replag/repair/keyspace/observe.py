"""What a key holds on one replica right now (`KeyState`), read in pipelined rounds.

Used to verify every candidate the trees point at before it is reported, and
under WATCH before every repair write. Expiry is kept as an absolute time on
our own clock (arrival time of the PTTL reply + PTTL), so replicas scanned at
different moments compare by when the key dies, not by how long it has left.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from replag.repair.keyspace.digest import string_digest
from replag.repair.keyspace.field_ttls import (
    FieldExpiries,
    db_has_field_ttls,
    same_field_expiries,
)
from replag.repair.keyspace.slots import is_moved
from replag.repair.keyspace.values import Data, read_values, string_page
from replag.wire.resp import RespConnection, error_text, pack


@dataclass(frozen=True)
class KeyState:
    """One key on one replica. `digest is None` on a present key means it changed while read,
    unless the key is `opaque`: a value replag cannot read whole (a module type; `opaque`
    says why), of which only the type and expiry are known. Two opaque states of one type
    are the same value as far as a read can tell, which is all that a re-read (or a guard
    before a write) asks; whether two members agree on one is not known (`uncompared`)."""

    exists: bool
    type: str | None = None
    digest: int | None = None
    expiry_ms: int | None = None
    data: Data | None = field(default=None, compare=False, repr=False)  # a string's value
    # Hash fields read alongside (a `newest:FIELD` policy's timestamp), not the whole hash.
    fields: dict[bytes, bytes] | None = field(default=None, compare=False, repr=False)
    # A Redis Cluster node answered MOVED/ASK: the key's slot is served elsewhere (now).
    moved: bool = field(default=False, compare=False)
    # A string's length in bytes (a DUMP of it must fit one reply: `guarded_write`).
    size: int | None = field(default=None, compare=False)
    # A hash's fields that have a TTL (`field_ttls`): compared as expiries are.
    field_expiries: FieldExpiries | None = field(default=None, compare=False, repr=False)
    opaque: str | None = field(default=None, compare=False)

    @property
    def readable(self) -> bool:
        return not self.moved and (
            not self.exists or self.digest is not None or self.opaque is not None
        )

    def same_value(self, other: KeyState) -> bool:
        return (self.exists, self.type, self.digest) == (other.exists, other.type, other.digest)

    def same_expiry(self, other: KeyState, tolerance_ms: int) -> bool:
        """The key's expiry, and each of a hash's fields' (within the tolerance)."""
        if not same_field_expiries(self.field_expiries, other.field_expiries, tolerance_ms):
            return False
        if self.expiry_ms is None or other.expiry_ms is None:
            return self.expiry_ms is None and other.expiry_ms is None
        return abs(self.expiry_ms - other.expiry_ms) <= tolerance_ms

    def same_as(self, other: KeyState, tolerance_ms: int) -> bool:
        return self.same_value(other) and (not self.exists or self.same_expiry(other, tolerance_ms))

    def remaining_ms(self, now_ms: int | None = None) -> int | None:
        if self.expiry_ms is None:
            return None
        return self.expiry_ms - (now_ms if now_ms is not None else time.time_ns() // 1_000_000)

    def to_dict(self) -> dict[str, Any]:
        if self.moved:
            return {"exists": None, "moved": True}
        if not self.exists:
            return {"exists": False}
        out: dict[str, Any] = {
            "exists": True,
            "type": self.type,
            "digest": f"{self.digest:016x}" if self.digest is not None else None,
            "ttl_ms": self.remaining_ms(),
        }
        if self.field_expiries is not None:
            out["fields_with_ttl"] = len(self.field_expiries)
        if self.opaque is not None:
            out["not_compared"] = self.opaque
        return out


ABSENT = KeyState(exists=False)
MOVED = KeyState(exists=True, moved=True)


def key_to_json(key: bytes) -> dict[str, str]:
    """A key for JSON: text when it is UTF-8, else base64 (keys are bytes)."""
    try:
        return {"key": key.decode("utf-8")}
    except UnicodeDecodeError:
        return {"key_b64": base64.b64encode(key).decode("ascii")}


def key_text(key: bytes) -> dict[str, str]:
    """`key` always as text (undecodable bytes as \\xNN), plus `key_b64`, the lossless
    form, when the key is not UTF-8."""
    try:
        return {"key": key.decode("utf-8")}
    except UnicodeDecodeError:
        return {
            "key": key.decode("utf-8", "backslashreplace"),
            "key_b64": base64.b64encode(key).decode("ascii"),
        }


def key_from_json(item: dict[str, Any]) -> bytes:
    """The key of `key_to_json` or `key_text` output."""
    if "key_b64" in item:
        return base64.b64decode(item["key_b64"])
    return str(item["key"]).encode("utf-8")


async def observe_keys(
    conn: RespConnection,
    keys: Sequence[bytes],
    *,
    chunk: int = 1000,
    keep: bool = True,
    fields: Sequence[bytes] = (),
    field_ttls: bool | None = None,
) -> dict[bytes, KeyState]:
    """TYPE, PTTL and a string's first page (GETRANGE) per key in one round, then chunked
    reads of collections and of strings longer than a page.

    Collections are digested as they stream and never kept (memory does not grow
    with them); `keep` keeps string values, `fields` reads those hash fields too.
    A page is half of max_reply_bytes, so a string longer than one reply may carry
    is read, and digested as if whole, in pages (`string_page`). A hash's fields' TTLs
    are read where its database holds any (`field_ttls` None: INFO keyspace says).
    """
    if not keys:
        return {}
    last = string_page(conn.endpoint.limits) - 1
    payload = b"".join(
        pack(b"TYPE", k) + pack(b"PTTL", k) + pack(b"GETRANGE", k, 0, last) for k in keys
    )
    replies, arrived_ns = await conn.wait(conn.send(payload, 3 * len(keys)))
    now_ms = arrived_ns // 1_000_000
    out: dict[bytes, KeyState] = {}
    collections: list[tuple[bytes, str]] = []
    expiries: dict[bytes, int | None] = {}
    for i, key in enumerate(keys):
        type_reply, ttl, value = replies[3 * i : 3 * i + 3]
        if is_moved(type_reply) or is_moved(ttl):
            out[key] = MOVED  # a Cluster slot that moved: not this node's to answer
            continue
        conn.check([type_reply, ttl])
        type_name = type_reply.decode() if isinstance(type_reply, bytes) else str(type_reply)
        if type_name == "none" or ttl == -2:
            out[key] = ABSENT
            continue
        expiries[key] = int(ttl) + now_ms if int(ttl) >= 0 else None
        if type_name == "string":
            if isinstance(value, bytes) and len(value) > last:
                out[key] = await _long_string(conn, key, value, expiries[key], keep)
            elif isinstance(value, bytes):
                out[key] = KeyState(
                    True,
                    "string",
                    string_digest(value),
                    expiries[key],
                    value if keep else None,
                    size=len(value),
                )
            else:  # changed type between TYPE and GETRANGE
                out[key] = KeyState(True, "string", None, expiries[key])
        elif error_text(value) is not None or value is None:
            collections.append((key, type_name))
        else:
            out[key] = KeyState(True, type_name, None, expiries[key])
    if not collections:
        return out
    if field_ttls is None and any(t == "hash" for _, t in collections):
        field_ttls = await db_has_field_ttls(conn)
    values = await read_values(conn, collections, chunk=chunk, field_ttls=bool(field_ttls))
    hashes = [k for k, t in collections if t == "hash"] if fields else []
    selected = await _hash_fields(conn, hashes, fields)
    for key, type_name in collections:
        read = values[key]
        opaque = read.opaque if read else None
        out[key] = KeyState(
            True,
            type_name,
            read.digest if read and opaque is None else None,
            expiries[key],
            fields=selected.get(key),
            field_expiries=read.field_expiries if read else None,
            opaque=opaque,
        )
    return out


async def _long_string(
    conn: RespConnection, key: bytes, first: bytes, expiry_ms: int | None, keep: bool
) -> KeyState:
    """A string whose first page came back full: the rest read in pages, hashed as they
    come (xxh3 streamed: the digest of the whole). Pages are separate reads: a string
    written meanwhile gets a digest of no single moment, which verification reads again."""
    page = len(first)
    digest = xxhash.xxh3_64(first)
    kept = [first] if keep else []
    size = page
    while True:
        (chunk,) = await conn.request(pack(b"GETRANGE", key, size, size + page - 1), 1)
        if not isinstance(chunk, bytes):
            return KeyState(True, "string", None, expiry_ms)  # changed type meanwhile
        digest.update(chunk)
        size += len(chunk)
        if keep:
            kept.append(chunk)
        if len(chunk) < page:
            break
    data = b"".join(kept) if keep else None
    return KeyState(True, "string", digest.intdigest(), expiry_ms, data, size=size)


async def _hash_fields(
    conn: RespConnection, keys: Sequence[bytes], fields: Sequence[bytes]
) -> dict[bytes, dict[bytes, bytes]]:
    """HMGET of `fields` on each hash key: the present ones, by key."""
    if not keys:
        return {}
    replies = await conn.request(b"".join(pack(b"HMGET", k, *fields) for k in keys), len(keys))
    out: dict[bytes, dict[bytes, bytes]] = {}
    for key, reply in zip(keys, replies, strict=True):
        if isinstance(reply, list):
            out[key] = {f: v for f, v in zip(fields, reply, strict=True) if isinstance(v, bytes)}
    return out
