"""Reading whole values of any type in pipelined chunks, as digests or as data.

Large collections are read with HSCAN/SSCAN/ZSCAN (COUNT `chunk`), LRANGE
ranges and XRANGE pages; every key still being read gets one chunk command
per round, and a round is one pipelined write. SCAN-family commands may
return an element twice, so unordered types are collected into a dict/set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replag.repair.digest import (
    OrderedDigest,
    hash_digest,
    set_digest,
    string_digest,
    zset_digest,
)
from replag.resp import RespConnection, error_text, pack

StreamEntry = tuple[bytes, list[bytes]]
Data = (
    bytes | dict[bytes, bytes] | set[bytes] | dict[bytes, float] | list[bytes] | list[StreamEntry]
)


@dataclass(frozen=True)
class ReadValue:
    """A key's value as read: its type, canonical digest and (if kept) the data."""

    type: str
    digest: int
    data: Data | None = None


class _Reader:
    """The state of one key being read chunk by chunk."""

    def __init__(self, key: bytes, type_name: str, chunk: int, keep: bool) -> None:
        self.key, self.type, self.chunk, self.keep = key, type_name, chunk, keep
        self.cursor: bytes = b"0"
        self.start = 0
        self.done = False
        self.failed = False
        self.pairs: dict[bytes, Any] = {}
        self.members: set[bytes] = set()
        self.items: list[Any] = []
        self.ordered = OrderedDigest(type_name.encode())

    def command(self) -> bytes:
        k, n = self.key, self.chunk
        if self.type == "string":
            return pack(b"GET", k)
        if self.type == "hash":
            return pack(b"HSCAN", k, self.cursor, b"COUNT", n)
        if self.type == "set":
            return pack(b"SSCAN", k, self.cursor, b"COUNT", n)
        if self.type == "zset":
            return pack(b"ZSCAN", k, self.cursor, b"COUNT", n)
        if self.type == "list":
            return pack(b"LRANGE", k, self.start, self.start + n - 1)
        # Streams: "(" makes the start exclusive (Redis >= 6.2).
        return pack(b"XRANGE", k, self.cursor, b"+", b"COUNT", n)

    def feed(self, reply: Any) -> None:
        if error_text(reply) is not None or (reply is None and self.type == "string"):
            # WRONGTYPE or gone: the key changed under us; the caller re-reads it later.
            self.failed = self.done = True
            return
        if self.type == "string":
            self.items = [reply]
            self.done = True
        elif self.type in ("hash", "zset", "set"):
            cursor, flat = reply
            if self.type == "set":
                self.members.update(flat)
            elif self.type == "hash":
                self.pairs.update(zip(flat[0::2], flat[1::2], strict=True))
            else:
                self.pairs.update(zip(flat[0::2], map(float, flat[1::2]), strict=True))
            self.cursor = cursor
            self.done = cursor == b"0"
        elif self.type == "list":
            for item in reply:
                self.ordered.add(item)
            if self.keep:
                self.items.extend(reply)
            self.start += len(reply)
            self.done = len(reply) < self.chunk
        else:
            for entry_id, fields in reply:
                self.ordered.add(entry_id, *fields)
                if self.keep:
                    self.items.append((entry_id, list(fields)))
            if reply:
                self.cursor = b"(" + reply[-1][0]
            self.done = len(reply) < self.chunk

    def result(self) -> ReadValue | None:
        if self.failed:
            return None
        if self.type == "string":
            value: bytes = self.items[0]
            return ReadValue("string", string_digest(value), value if self.keep else None)
        if self.type == "hash":
            return ReadValue("hash", hash_digest(self.pairs), self.pairs if self.keep else None)
        if self.type == "zset":
            return ReadValue("zset", zset_digest(self.pairs), self.pairs if self.keep else None)
        if self.type == "set":
            return ReadValue("set", set_digest(self.members), self.members if self.keep else None)
        return ReadValue(self.type, self.ordered.digest(), self.items if self.keep else None)


SUPPORTED_TYPES = ("string", "hash", "set", "zset", "list", "stream")


async def read_values(
    conn: RespConnection,
    typed_keys: Sequence[tuple[bytes, str]],
    *,
    chunk: int = 1000,
    keep: bool = False,
) -> dict[bytes, ReadValue | None]:
    """Read every (key, type); None for a key that vanished or changed type meanwhile.

    A type replag does not know (a module type) raises nothing: it gets None.
    """
    readers = [_Reader(k, t, chunk, keep) for k, t in typed_keys if t in SUPPORTED_TYPES]
    out: dict[bytes, ReadValue | None] = {k: None for k, _ in typed_keys}
    active = readers
    while active:
        payload = b"".join(r.command() for r in active)
        replies = await conn.request(payload, len(active))
        for reader, reply in zip(active, replies, strict=True):
            reader.feed(reply)
        active = [r for r in active if not r.done]
    for reader in readers:
        out[reader.key] = reader.result()
    return out
