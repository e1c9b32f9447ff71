"""Canonical per-type digests and the per-key entry hash the Tictac tree XORs.

Two replicas holding the same logical value get the same 64-bit digest
whatever their internal encoding (listpack or hashtable, intset or hashtable):
unordered collections hash each element and sort the element hashes, ordered
ones (list, stream) hash their elements in order. Every hash is xxh3_64.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

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


def _unordered(tag: bytes, element_hashes: U64) -> int:
    # Sorting the element hashes makes the digest independent of SCAN order
    # and of the server's encoding; callers pass each element once.
    return int(_h64(tag + np.sort(element_hashes).tobytes()))


def hash_digest(fields: dict[bytes, bytes]) -> int:
    # Field and value are hashed separately and mixed, so ("ab", "c") and
    # ("a", "bc") differ; vectorised because hashes can have millions of fields.
    n = len(fields)
    names, values = _hashes(fields.keys(), n), _hashes(fields.values(), n)
    return _unordered(b"hash", _mix(names ^ _mix(values + np.uint64(0x9E3779B97F4A7C15))))


def set_digest(members: set[bytes]) -> int:
    return _unordered(b"set", _hashes(members, len(members)))


def zset_digest(scores: dict[bytes, float]) -> int:
    # Scores compare as IEEE doubles: "1", "1.0" and "1e0" from different
    # server versions are the same score.
    n = len(scores)
    members = _hashes(scores.keys(), n)
    bits = np.fromiter(scores.values(), dtype=np.float64, count=n).view(np.uint64)
    return _unordered(b"zset", _mix(members ^ _mix(bits + np.uint64(0x632BE59BD9B4E019))))


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
