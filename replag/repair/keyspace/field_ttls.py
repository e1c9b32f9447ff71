"""Hash-field TTLs (Redis >= 7.4 HPEXPIRE, Valkey >= 9): part of a hash, read cheaply.

A field's expiry is part of the hash it lives in: two replicas whose hash has the
same fields and values but a field expiring at other times (or never) differ, and
a copy of the hash carries each field's expiry. `FieldExpiries` holds the expiries
of a hash's fields that have one (absolute ms, our clock, as key expiries are
kept), compared with the same tolerance as key expiries; in a tree's entry they
count by bucket (`bucket_digest`), as a key's expiry does.

Reading them costs nothing where none can exist: a server without field TTLs, or a
database whose INFO keyspace counts no key with volatile fields (`subexpiry` on
Redis 8, `keys_with_volatile_items` on Valkey 9), is read as before. Elsewhere a
hash's OBJECT ENCODING (asked with its HLEN) tells a plain `listpack`, which cannot
hold field TTLs, from `listpackex` or `hashtable`, whose pages are followed by
HPEXPIRETIME of their fields, pipelined with the next page.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from replag.repair.keyspace.native import hash_each
from replag.wire.resp import RespConnection, pack

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
# INFO keyspace's count of keys with volatile fields, by server.
_VOLATILE_FIELDS = (b"subexpiry", b"keys_with_volatile_items")
# Encodings that cannot hold a field with a TTL (Redis 8 uses `listpackex` for a small
# hash with one; Valkey 9 converts such a hash to `hashtable`).
PLAIN_ENCODINGS = (b"listpack", b"ziplist")
# Field names kept for the report up to this many fields with a TTL (beyond: hashes).
NAMED_FIELDS = 1000
FIELDS_PER_COMMAND = 1000
_h64 = xxhash.xxh3_64_intdigest


def keys_with_volatile_fields(info: object, db: int) -> int | None:
    """Keys of `db` holding fields with a TTL, from an INFO keyspace reply: None where
    the server does not say (it has no field TTLs), 0 when the db has no keys."""
    if not isinstance(info, bytes):
        return None
    prefix = b"db%d:" % db
    said = any(name + b"=" in info for name in _VOLATILE_FIELDS)
    for line in info.splitlines():
        if line.startswith(prefix):
            for item in line[len(prefix) :].split(b","):
                name, _, value = item.partition(b"=")
                if name in _VOLATILE_FIELDS and value.isdigit():
                    return int(value)
            return None
    return 0 if said else None


def version_has_field_ttls(info: object) -> bool:
    """Whether an INFO server reply is of a server with hash-field TTLs (Redis 7.4+,
    Valkey 9+; Valkey reports a redis_version of 7.2 too, so its own comes first)."""
    if not isinstance(info, bytes):
        return False
    fields = dict(line.partition(b":")[::2] for line in info.splitlines() if b":" in line)
    for name, since in ((b"valkey_version", (9, 0)), (b"redis_version", (7, 4))):
        if name in fields:
            parts = fields[name].strip().split(b".")
            try:
                return tuple(int(p) for p in parts[:2]) >= since
            except ValueError:
                return False
    return False


async def server_has_field_ttls(conn: RespConnection) -> bool:
    """Whether `conn`'s server keeps hash-field TTLs: asked once per connection."""
    if conn.field_ttls is None:
        (info,) = await conn.request(pack(b"INFO", b"server"), 1)
        conn.field_ttls = version_has_field_ttls(info)
    return conn.field_ttls


async def db_has_field_ttls(conn: RespConnection) -> bool:
    """Whether any key of `conn`'s database has fields with a TTL now (INFO keyspace):
    where none has, a hash is read as on a server without them."""
    if not await server_has_field_ttls(conn):
        return False
    (info,) = await conn.request(pack(b"INFO", b"keyspace"), 1)
    count = keys_with_volatile_fields(info, conn.endpoint.db)
    return count is None or count > 0


_FEW = 32


def field_hashes(names: Sequence[bytes]) -> U64:
    return hash_each(list(names))


@dataclass(frozen=True, eq=False)
class FieldExpiries:
    """The fields of one hash that have a TTL: per field its name's hash, its absolute
    expiry (ms, our clock) and, up to `NAMED_FIELDS` of them, its name."""

    hashes: U64  # sorted
    expiry_ms: I64
    names: tuple[bytes, ...] | None = field(default=None, repr=False)
    # `of` a few fields: (hashes, expiries) as plain integers too.
    _few: tuple[list[int], list[int]] | None = field(default=None, repr=False, init=False)

    @classmethod
    def of(
        cls,
        names: Sequence[bytes],
        expiry_ms: Sequence[int] | I64,
        *,
        every_name: bool = False,
    ) -> FieldExpiries | None:
        """None when no field has one (a hash without field TTLs stays as it was); the
        names kept up to `NAMED_FIELDS`, or all of them (`every_name`: for a copy)."""
        if not names:
            return None
        if len(names) <= _FEW:
            times = expiry_ms.tolist() if isinstance(expiry_ms, np.ndarray) else expiry_ms
            rows = sorted(zip(map(_h64, names), names, times, strict=True))
            few = ([r[0] for r in rows], [int(r[2]) for r in rows])
            made = cls(
                np.array(few[0], dtype=np.uint64),
                np.array(few[1], dtype=np.int64),
                tuple(r[1] for r in rows),
            )
            # The same as plain integers, for `bucket_digest` (no array calls per hash).
            object.__setattr__(made, "_few", few)
            return made
        hashes = field_hashes(names)
        order = np.argsort(hashes, kind="stable")
        named = every_name or len(names) <= NAMED_FIELDS
        kept = tuple(names[i] for i in order) if named else None
        return cls(hashes[order], np.asarray(expiry_ms, dtype=np.int64)[order], kept)

    def __len__(self) -> int:
        return len(self.hashes)

    def bucket_digest(self, bucket_ms: int) -> int:
        """What a tree's entry for the hash mixes in: each field (by its name's hash, the
        fields in that order: any order they were read in) with its expiry's bucket. The
        exact comparison, with the tolerance, is `differing`."""
        width = max(int(bucket_ms), 1)
        if self._few is not None:
            # A few fields (the common hash): one struct of plain integers, the same bytes
            # as the arrays give, without their cost per call (per hash of a scan).
            hashes, expiries = self._few
            pairs = [x for h, e in zip(hashes, expiries, strict=True) for x in (h, e // width)]
            return int(_h64(b"fttl" + struct.pack(f"<{len(pairs)}Q", *pairs)))
        pairs_array = np.empty((len(self.hashes), 2), dtype=np.uint64)
        pairs_array[:, 0] = self.hashes
        pairs_array[:, 1] = (self.expiry_ms // np.int64(width)).astype(np.uint64)
        return int(_h64(b"fttl" + pairs_array.tobytes()))

    def differing(self, other: FieldExpiries | None, tolerance_ms: int) -> list[int]:
        """Hashes of the fields whose expiry differs from `other`'s by more than the
        tolerance, or that have one on one side only."""
        if other is None:
            return [int(h) for h in self.hashes]
        both, mine, theirs = np.intersect1d(
            self.hashes, other.hashes, assume_unique=True, return_indices=True
        )
        far = np.abs(self.expiry_ms[mine] - other.expiry_ms[theirs]) > tolerance_ms
        only = np.setxor1d(self.hashes, other.hashes, assume_unique=True)
        return [int(h) for h in both[far]] + [int(h) for h in only]

    def items(self) -> list[tuple[bytes, int]]:
        """(name, expiry) of every field, when every name was kept (`of(every_name=True)`)."""
        assert self.names is not None and len(self.names) == len(self.hashes)
        return list(zip(self.names, (int(e) for e in self.expiry_ms), strict=True))

    def name_of(self, field_hash: int) -> bytes | None:
        if self.names is None:
            return None
        at = int(np.searchsorted(self.hashes, np.uint64(field_hash)))
        return self.names[at] if at < len(self.hashes) else None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "hashes": [f"{int(h):016x}" for h in self.hashes],
            "expiry_ms": [int(e) for e in self.expiry_ms],
        }
        if self.names is not None:
            out["names"] = [n.hex() for n in self.names]
        return out

    @classmethod
    def from_wire(cls, item: dict[str, Any]) -> FieldExpiries:
        hashes = np.array([int(h, 16) for h in item["hashes"]], dtype=np.uint64)
        expiry = np.array([int(e) for e in item["expiry_ms"]], dtype=np.int64)
        names = item.get("names")
        if len(hashes) != len(expiry) or (names is not None and len(names) != len(hashes)):
            raise ValueError("field expiries of unequal lengths")
        if len(hashes) > 1 and not bool(np.all(hashes[1:] > hashes[:-1])):
            raise ValueError("field hashes not sorted")
        kept = tuple(bytes.fromhex(n) for n in names) if names is not None else None
        return cls(hashes, expiry, kept)


def differing_fields(
    states: Sequence[FieldExpiries | None], tolerance_ms: int, *, limit: int = 10
) -> tuple[list[str], int]:
    """(up to `limit` names of fields whose TTLs differ among `states`, how many differ):
    what a report says of a hash whose fields' TTLs differ."""
    first = next((s for s in states if s is not None), None)
    if first is None:
        return [], 0
    hashes: set[int] = set()
    for s in states:
        if s is not first:
            hashes.update(first.differing(s, tolerance_ms))
            if s is not None:
                hashes.update(s.differing(first, tolerance_ms))
    names: list[str] = []
    for h in sorted(hashes):
        name = next((n for s in states if s is not None and (n := s.name_of(h)) is not None), None)
        if name is not None and len(names) < limit:
            names.append(name.decode("utf-8", "backslashreplace"))
    return names, len(hashes)


def same_field_expiries(
    a: FieldExpiries | None, b: FieldExpiries | None, tolerance_ms: int
) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return len(a) == len(b) and not a.differing(b, tolerance_ms)


def entry_digest(value_digest: int, expiries: FieldExpiries | None, bucket_ms: int) -> int:
    """A hash's digest in a tree: its value's, and its fields' expiries by bucket."""
    if expiries is None:
        return value_digest
    return int(_h64(struct.pack("<QQ", value_digest, expiries.bucket_digest(bucket_ms))))


def field_expiry_writes(key: bytes, expiries: Sequence[tuple[bytes, int]]) -> list[bytes]:
    """HPEXPIREAT commands giving each (field, absolute expiry ms) its expiry: one per
    expiry time (fields set together usually share one), at most `FIELDS_PER_COMMAND`
    fields each."""
    by_time: dict[int, list[bytes]] = {}
    for name, at in expiries:
        by_time.setdefault(at, []).append(name)
    out: list[bytes] = []
    for at, names in by_time.items():
        for i in range(0, len(names), FIELDS_PER_COMMAND):
            part = names[i : i + FIELDS_PER_COMMAND]
            out.append(pack(b"HPEXPIREAT", key, at, b"FIELDS", len(part), *part))
    return out
