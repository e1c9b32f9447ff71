"""The safety workload's data: keys, versioned values, and what a replica holds at the end.

Every value carries the version of the write that made it, so for any state a
replica ends in the checker can tell which write each part came from:

    string  JSON {"v": n, "ts": n}            SET, DEL, PEXPIREAT
    hash    fields f0..f7 = n, field ts = n   HSET (one field and ts), DEL, PEXPIREAT
    set     members "n"                       SADD, DEL, PEXPIREAT
    zset    members m0..m7 scored n           ZADD (one member), DEL, PEXPIREAT

Expiry times are versioned as well: PEXPIREAT sets `expiry_base_ms + n *
EXPIRY_STEP_MS`, far in the future, so a TTL read back names its write. Version 1
is what the harness loads on every replica, version 0 the stale state a fault
leaves behind; the writers' versions start at 2 and only grow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from replag.wire.resp import pack

TYPES = ("string", "hash", "set", "zset")
_LETTER = {"string": "s", "hash": "h", "set": "t", "zset": "z"}
FIELDS = 8
EXPIRY_STEP_MS = 10_000  # far above ttl_tolerance: neighbouring versions never blur
LOADED, STALE = 1, 0


@dataclass(frozen=True)
class Keyspace:
    """`keys` keys named safety:<seed>:<letter>:<i>, types in a fixed rotation."""

    keys: int
    seed: int = 0

    def name(self, index: int) -> bytes:
        kind = self.type(index)
        return f"safety:{self.seed}:{_LETTER[kind]}:{index:07d}".encode()

    def type(self, index: int) -> str:
        # 2 strings, then one of each collection: strings carry most traffic in practice.
        return ("string", "hash", "string", "set", "zset")[index % 5]

    def index(self, key: bytes) -> int:
        return int(key.rsplit(b":", 1)[1])


def string_value(version: int) -> bytes:
    return json.dumps({"v": version, "ts": version}).encode()


def state_commands(key: bytes, kind: str, version: int) -> list[bytes]:
    """Commands that make `key` hold the full version-`version` value (after a DEL)."""
    out = [pack(b"DEL", key)]
    if kind == "string":
        out.append(pack(b"SET", key, string_value(version)))
    elif kind == "hash":
        pairs = [x for j in range(FIELDS) for x in (b"f%d" % j, b"%d" % version)]
        out.append(pack(b"HSET", key, *pairs, b"ts", b"%d" % version))
    elif kind == "set":
        out.append(pack(b"SADD", key, *[b"%d" % v for v in range(version + 1)]))
    else:
        pairs = [x for j in range(FIELDS) for x in (b"%d" % version, b"m%d" % j)]
        out.append(pack(b"ZADD", key, *pairs))
    return out


def write_command(
    key: bytes, kind: str, version: int, slot: int
) -> tuple[bytes, tuple[bytes, ...]]:
    """The non-delete write of version `version`: its command and the elements it sets."""
    if kind == "string":
        return pack(b"SET", key, string_value(version)), (b"",)
    if kind == "hash":
        name = b"f%d" % slot
        return pack(b"HSET", key, name, b"%d" % version, b"ts", b"%d" % version), (name, b"ts")
    if kind == "set":
        member = b"%d" % version
        return pack(b"SADD", key, member), (member,)
    member = b"m%d" % slot
    return pack(b"ZADD", key, b"%d" % version, member), (member,)


def expire_command(key: bytes, version: int, base_ms: int) -> bytes:
    return pack(b"PEXPIREAT", key, base_ms + version * EXPIRY_STEP_MS)


@dataclass(frozen=True)
class Held:
    """What one replica holds for one key: type, element → version, expiry version."""

    type: str | None  # None: absent
    elements: dict[bytes, int] = field(default_factory=dict)
    expiry: int | None = None  # the version of the PEXPIREAT that set it; None = no TTL

    @property
    def exists(self) -> bool:
        return self.type is not None

    def to_dict(self) -> dict[str, Any]:
        if self.type is None:
            return {"exists": False}
        elements = {k.decode(errors="replace"): v for k, v in sorted(self.elements.items())}
        return {"type": self.type, "elements": elements, "expiry": self.expiry}


ABSENT = Held(None)


def expiry_version(expiry_ms: int, base_ms: int) -> int:
    return round((expiry_ms - base_ms) / EXPIRY_STEP_MS)


def read_commands(key: bytes) -> list[bytes]:
    """TYPE, PTTL and every read that can decode the key's value, in one round."""
    return [
        pack(b"TYPE", key),
        pack(b"PTTL", key),
        pack(b"GET", key),
        pack(b"HGETALL", key),
        pack(b"SMEMBERS", key),
        pack(b"ZRANGE", key, 0, -1, b"WITHSCORES"),
    ]


def decode_held(replies: list[Any], now_ms: int, base_ms: int) -> Held:
    """A `Held` from the six replies of `read_commands` (error replies for wrong types)."""
    type_reply, pttl, string, hash_, members, zset = replies
    kind = type_reply.decode() if isinstance(type_reply, bytes) else str(type_reply)
    if kind == "none":
        return ABSENT
    expiry = expiry_version(now_ms + int(pttl), base_ms) if int(pttl) >= 0 else None
    elements: dict[bytes, int] = {}
    if kind == "string" and isinstance(string, bytes):
        elements[b""] = int(json.loads(string)["v"])
    elif kind == "hash" and isinstance(hash_, list):
        elements = {hash_[i]: int(hash_[i + 1]) for i in range(0, len(hash_), 2)}
    elif kind == "set" and isinstance(members, list):
        elements = {m: int(m) for m in members}
    elif kind == "zset" and isinstance(zset, list):
        elements = {zset[i]: int(float(zset[i + 1])) for i in range(0, len(zset), 2)}
    return Held(kind, elements, expiry)
