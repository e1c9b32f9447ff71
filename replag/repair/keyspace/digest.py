"""Canonical per-type digests and the per-key entry hash the Tictac tree XORs.

Two replicas holding the same logical value get the same 64-bit digest
whatever their internal encoding (listpack or hashtable, intset or hashtable)
and server version. Unordered collections (hash, set, zset) are digested as
they stream in pages (`UnorderedDigest`): each element's hash is mixed, then
summed and XORed into two 64-bit words, an order-independent combination, so
nothing but the element count and two integers is kept, however large the
collection, and no sort is needed. Ordered ones (list, stream) hash their
elements in order (`OrderedDigest`). Every hash is xxh3_64.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt
import xxhash

U64 = npt.NDArray[np.uint64]

TYPE_CODES: dict[str, int] = {
    "string": 1,
    "hash": 2,
    "set": 3,
    "zset": 4,
    "list": 5,
    "stream": 6,
    # Read by their content (`vector_sets`, `json_values`); other types are 0 in a tree.
    "vectorset": 7,
    "ReJSON-RL": 8,
}
TYPE_NAMES: dict[int, str] = {code: name for name, code in TYPE_CODES.items()}
_NO_EXPIRY_BUCKET = np.uint64(0xFFFF_FFFF_FFFF_FFFF)

_h64 = xxhash.xxh3_64_intdigest


def key_hash(key: bytes) -> int:
    return int(_h64(key))


def string_digest(value: bytes) -> int:
    return int(_h64(value))


def _length_prefixed(*parts: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(p)) + p for p in parts)


def _hashes(items: Iterable[bytes], count: int) -> U64:
    return np.fromiter(map(_h64, items), dtype=np.uint64, count=count)


_MASK = (1 << 64) - 1


class UnorderedDigest:
    """Digest of a hash, set or sorted set fed page by page, in any order.

    SCAN-family commands may return an element twice (the server's table resized
    between pages): a duplicate would count twice. The element `count` is kept
    so the caller can compare it with HLEN/SCARD/ZCARD and read the key again
    when they differ.
    """

    def __init__(self, tag: bytes) -> None:
        self.tag = tag
        self.count = 0
        self._sum = 0
        self._xor = 0

    def add(self, element_hashes: U64) -> None:
        """Fold in a page of per-element hashes (already mixed)."""
        if not len(element_hashes):
            return
        self.count += len(element_hashes)
        # uint64 array sums wrap modulo 2^64 (as they should here) without a warning.
        self._sum = (self._sum + int(element_hashes.sum(dtype=np.uint64))) & _MASK
        self._xor ^= int(np.bitwise_xor.reduce(element_hashes))

    def add_hash_page(self, fields: Sequence[bytes], values: Sequence[bytes]) -> None:
        # Field and value are hashed separately and mixed, so ("ab", "c") and
        # ("a", "bc") differ.
        n = len(fields)
        names, data = _hashes(fields, n), _hashes(values, n)
        self.add(_mix(names ^ _mix(data + np.uint64(0x9E3779B97F4A7C15))))

    def add_set_page(self, members: Sequence[bytes]) -> None:
        self.add(_mix(_hashes(members, len(members))))

    def add_zset_page(self, members: Sequence[bytes], scores: Sequence[float]) -> None:
        # Scores compare as IEEE doubles: "1", "1.0" and "1e0" from different
        # server versions are the same score.
        n = len(members)
        bits = np.fromiter(scores, dtype=np.float64, count=n).view(np.uint64)
        self.add(_mix(_hashes(members, n) ^ _mix(bits + np.uint64(0x632BE59BD9B4E019))))

    def digest(self) -> int:
        return int(_h64(self.tag + struct.pack("<QQQ", self.count, self._sum, self._xor)))


def hash_digest(fields: dict[bytes, bytes]) -> int:
    acc = UnorderedDigest(b"hash")
    acc.add_hash_page(list(fields), list(fields.values()))
    return acc.digest()


def set_digest(members: set[bytes]) -> int:
    acc = UnorderedDigest(b"set")
    acc.add_set_page(list(members))
    return acc.digest()


def zset_digest(scores: dict[bytes, float]) -> int:
    acc = UnorderedDigest(b"zset")
    acc.add_zset_page(list(scores), list(scores.values()))
    return acc.digest()


class OrderedDigest:
    """Digest of a list or stream fed in chunks, in order."""

    def __init__(self, tag: bytes) -> None:
        self._state = xxhash.xxh3_64(tag)

    def add(self, *parts: bytes) -> None:
        self._state.update(_length_prefixed(*parts))

    def digest(self) -> int:
        return int(self._state.intdigest())


def _mix(x: U64) -> U64:
    """splitmix64's finaliser, vectorised (uint64 arithmetic wraps in numpy arrays)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def expiry_buckets(expiry_ms: npt.NDArray[np.int64], bucket_ms: int) -> U64:
    """Absolute expiry (ms, -1 = none) → bucket of width `bucket_ms`.

    Replicas whose expiries fall in different buckets differ in the tree; the
    key-level comparison then applies the exact tolerance, so a pair straddling
    a bucket edge costs one extra read and is never reported.
    """
    width = max(int(bucket_ms), 1)
    buckets = (expiry_ms // width).astype(np.uint64)
    return np.where(expiry_ms < 0, _NO_EXPIRY_BUCKET, buckets)


def entry_hashes(
    key_hashes: U64, type_codes: npt.NDArray[np.uint8], digests: U64, expiry_bucket: U64
) -> U64:
    """hash(key, type, digest, expiry bucket) per key: what a tree leaf XORs."""
    inner = _mix(digests ^ (type_codes.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)))
    return _mix(key_hashes ^ inner ^ _mix(expiry_bucket + np.uint64(0x632BE59BD9B4E019)))


_STRING_TYPE = np.uint64(TYPE_CODES["string"]) * np.uint64(0x9E3779B97F4A7C15)
_NO_EXPIRY_MIXED = _mix(np.array([_NO_EXPIRY_BUCKET]) + np.uint64(0x632BE59BD9B4E019))[0]


def string_entry_hashes(key_hashes: U64, digests: U64) -> U64:
    """`entry_hashes` of strings without an expiry (most keys a scan reads), in fewer
    array passes."""
    return _mix(key_hashes ^ _mix(digests ^ _STRING_TYPE) ^ _NO_EXPIRY_MIXED)
