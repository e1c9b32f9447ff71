"""What a scan of one replica produces: a `ScanIndex` (per key its hash, entry hash and name).

Keys are kept in compact arrays, their names concatenated in one blob, so an
index of millions of keys is a few arrays; `index_batch` turns one batch's
values and TTLs into one (strings with no expiry in one loop in C).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from replag.repair.keyspace.digest import TYPE_CODES, entry_hashes, expiry_buckets
from replag.repair.keyspace.native import hash_each, string_index
from replag.repair.trees.tictac import TictacTree

U64 = npt.NDArray[np.uint64]
_CHUNK_HEADER = struct.Struct("<Q")


@dataclass
class ScanIndex:
    """Keys seen on one replica, in compact arrays (names concatenated in one blob)."""

    key_hashes: U64
    entries: U64
    lengths: npt.NDArray[np.uint32]
    blob: bytes
    _offsets: npt.NDArray[np.int64] | None = field(default=None, repr=False)

    @classmethod
    def empty(cls) -> ScanIndex:
        return cls(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint32), b"")

    def __len__(self) -> int:
        return len(self.key_hashes)

    def key(self, index: int) -> bytes:
        if self._offsets is None:
            self._offsets = np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)])
        start = int(self._offsets[index])
        return self.blob[start : start + int(self.lengths[index])]

    def to_bytes(self) -> bytes:
        """Checkpoint form: count, then the three arrays, then the key blob."""
        return b"".join(
            [
                _CHUNK_HEADER.pack(len(self)),
                self.key_hashes.astype("<u8").tobytes(),
                self.entries.astype("<u8").tobytes(),
                self.lengths.astype("<u4").tobytes(),
                self.blob,
            ]
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ScanIndex:
        (n,) = _CHUNK_HEADER.unpack_from(data)
        at = _CHUNK_HEADER.size
        hashes = np.frombuffer(data, "<u8", n, at).astype(np.uint64)
        entries = np.frombuffer(data, "<u8", n, at + 8 * n).astype(np.uint64)
        lengths = np.frombuffer(data, "<u4", n, at + 16 * n).astype(np.uint32)
        return cls(hashes, entries, lengths, data[at + 20 * n :])

    @classmethod
    def concat(cls, parts: list[ScanIndex]) -> ScanIndex:
        if not parts:
            return cls.empty()
        return cls(
            np.concatenate([p.key_hashes for p in parts]),
            np.concatenate([p.entries for p in parts]),
            np.concatenate([p.lengths for p in parts]),
            b"".join(p.blob for p in parts),
        )

    def deduplicated(self) -> ScanIndex:
        """Keep the last sighting of each key: SCAN may return a key twice while the
        server resizes its table, and a duplicate would cancel itself in an XOR tree."""
        if len(self) == 0:
            return self
        reversed_hashes = self.key_hashes[::-1]
        _, first_in_reversed = np.unique(reversed_hashes, return_index=True)
        if len(first_in_reversed) == len(self):
            return self
        keep = np.sort(len(self) - 1 - first_in_reversed)
        keys = [self.key(int(i)) for i in keep]
        return ScanIndex(
            self.key_hashes[keep], self.entries[keep], self.lengths[keep], b"".join(keys)
        )

    def tree(self, depth: int) -> TictacTree:
        tree = TictacTree(depth)
        tree.add(self.key_hashes, self.entries)
        return tree


def index_batch(
    keys: list[bytes],
    values: list[bytes],
    ttls: npt.NDArray[np.int64],
    now_ms: int | npt.NDArray[np.int64],
    bucket_ms: int,
    types: npt.NDArray[np.uint8] | None = None,
    keep: npt.NDArray[np.bool_] | None = None,
    digests_of: dict[int, int] | None = None,
) -> ScanIndex:
    """The index of a batch: per key its hash, its entry hash (type, value digest and
    expiry bucket, TTLs read at `now_ms`, one moment or one per key) and its name.
    `types` default to strings; `keep` (default: keys whose TTL is not -2, gone) picks
    the keys indexed;
    `digests_of` replaces the digest of `values[i]` for keys of other types."""
    n = len(keys)
    if types is None and keep is None and not digests_of and int(ttls.max(initial=-1)) == -1:
        # Strings, none with an expiry or gone: the common batch, one loop in C.
        return ScanIndex(*string_index(keys, values))
    digests = hash_each(values)
    if digests_of:
        digests = digests.copy()
        for i, digest in digests_of.items():
            digests[i] = digest
    key_hashes = hash_each(keys)
    if types is None:
        types = np.full(n, TYPE_CODES["string"], dtype=np.uint8)
    expiry = np.where(ttls >= 0, ttls + now_ms, -1)
    entries = entry_hashes(key_hashes, types, digests, expiry_buckets(expiry, bucket_ms))
    if keep is None:
        keep = ttls != -2
    if not keep.all():
        idx = np.flatnonzero(keep)
        keys = [keys[i] for i in idx]
        key_hashes, entries = key_hashes[idx], entries[idx]
    lengths = np.fromiter(map(len, keys), dtype=np.uint32, count=len(keys))
    return ScanIndex(key_hashes, entries, lengths, b"".join(keys))
