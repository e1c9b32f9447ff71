"""Reading a vector set (Redis 8's `vectorset`) by its content, in pipelined rounds.

Identical vector sets DUMP to different bytes (each node's HNSW level is drawn at
random), so a set is digested by what defines it: the VINFO fields that say how it
quantizes and links (`DEFINING`), and per element its name, its embedding as the
server keeps it (`VEMB … RAW`: the quantization, the stored bytes, the L2 norm and,
for int8, the quantization range) and its attributes (`VGETATTR`). Redis 8.2 has no
range or scan over a set's elements; `VRANDMEMBER key N` with N at least the set's size
returns every element once, so a set of up to max_reply_elements elements is listed in
one reply and its elements read `chunk` at a time. A larger set is named, not read.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import xxhash

from replag.repair.keyspace.digest import UnorderedDigest
from replag.wire.reply_limits import ReplyLimits
from replag.wire.resp import error_text, pack

TYPE = "vectorset"
# VINFO fields that define a set (the rest, size, max-level, vset-uid, hnsw-max-node-uid
# and attributes-count, are counts or internals that differ between equal sets).
DEFINING = (b"quant-type", b"vector-dim", b"hnsw-m", b"projection-input-dim")
_h64 = xxhash.xxh3_64_intdigest


def _part(value: Any) -> bytes:
    """One field of a reply as bytes: numbers (RESP2 sends doubles as text, RESP3 as
    doubles) packed as IEEE doubles, so "3.0" and 3.0 agree."""
    if isinstance(value, bytes):
        try:
            return struct.pack("<d", float(value))
        except ValueError:
            return value
    if isinstance(value, int | float):
        return struct.pack("<d", float(value))
    return repr(value).encode()


def element_hash(name: bytes, embedding: list[Any], attributes: bytes | None) -> int:
    """One element's hash: its name, its raw embedding (quantization name and bytes kept as
    they are, the norm and range as doubles) and its attributes (absent ≠ empty)."""
    quant, blob, *numbers = embedding
    parts = [name, bytes(quant), bytes(blob), *map(_part, numbers)]
    parts.append(b"\x01" + attributes if attributes is not None else b"\x00")
    return int(_h64(b"".join(struct.pack("<I", len(p)) + p for p in parts)))


class VectorSetReader:
    """The state of one vector set being read: VINFO, then its element names, then its
    elements `chunk` at a time (`values.read_values` drives it as any other reader)."""

    def __init__(self, key: bytes, chunk: int, limits: ReplyLimits) -> None:
        self.key, self.type, self.chunk = key, TYPE, max(1, chunk)
        self.limits = limits
        self.done = False
        self.failed = False
        self.opaque: str | None = None  # why the set was not read (too large)
        self.size: int | None = None
        self.names: list[bytes] | None = None
        self.at = 0  # elements read so far
        self.asked: list[bytes] = []
        self.unordered = UnorderedDigest(b"vectorset")

    @property
    def replies(self) -> int:
        if self.names is None:
            return 1
        return 2 * len(self._next()) + self._last()

    def _last(self) -> int:
        """1 when the next round reads the last elements (a VCARD follows them)."""
        assert self.names is not None
        return int(self.at + self.chunk >= len(self.names))

    def _next(self) -> list[bytes]:
        assert self.names is not None
        return self.names[self.at : self.at + self.chunk]

    def command(self) -> bytes:
        k = self.key
        if self.size is None:
            return pack(b"VINFO", k)
        if self.names is None:
            return pack(b"VRANDMEMBER", k, self.size)
        self.asked = self._next()
        reads = b"".join(pack(b"VEMB", k, n, b"RAW") + pack(b"VGETATTR", k, n) for n in self.asked)
        return reads + (pack(b"VCARD", k) if self._last() else b"")

    def feed(self, replies: list[Any]) -> None:
        if any(error_text(r) is not None for r in replies) or replies[0] is None:
            self.failed = self.done = True  # WRONGTYPE or gone: changed under us
            return
        if self.size is None:
            self._info(replies[0])
        elif self.names is None:
            self.names = list(replies[0])
            # A set changed between VINFO and VRANDMEMBER: read again later.
            self.failed = self.done = len(self.names) != self.size or not self.names
        else:
            self._elements(replies)

    def _info(self, reply: list[Any]) -> None:
        info = dict(zip(reply[0::2], reply[1::2], strict=False))
        size = info.get(b"size")
        if not isinstance(size, int) or size <= 0:
            self.failed = self.done = True
            return
        limit = self.limits.max_elements
        if size > limit:
            self.opaque = (
                f"a vector set of {size:,} elements: listing them would pass "
                f"max_reply_elements = {limit:,}"
            )
            self.done = True
            return
        self.size = size
        defining = [_part(info.get(f)) for f in DEFINING]
        head = b"".join(struct.pack("<I", len(p)) + p for p in defining)
        self.unordered = UnorderedDigest(b"vectorset" + head)

    def _elements(self, replies: list[Any]) -> None:
        hashes = []
        for i, name in enumerate(self.asked):
            embedding, attributes = replies[2 * i], replies[2 * i + 1]
            if not isinstance(embedding, list) or len(embedding) < 2:
                self.failed = self.done = True  # removed since it was listed
                return
            hashes.append(element_hash(name, embedding, attributes))
        # xxh3's output is mixed already: the order-free sum and XOR take it as it is.
        self.unordered.add(np.array(hashes, dtype=np.uint64))
        self.at += len(self.asked)
        if self.at < len(self.names or ()):
            return
        self.done = True
        # Elements added since the set was listed: its size moved (read again later).
        self.failed = replies[-1] != self.size

    @property
    def digest(self) -> int:
        return self.unordered.digest()
