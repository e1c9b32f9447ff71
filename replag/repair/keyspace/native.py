"""A scan's per-key hashing: in C (`replag._scanindex`, built by the install when a
compiler is there) or, without it, the same results in Python.

Each function returns numpy arrays; `NATIVE` says which implementation runs.
`tests/repair/test_native.py` checks the two agree bit for bit.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from replag.repair.keyspace.digest import string_entry_hashes

U64 = npt.NDArray[np.uint64]
_native: Any
try:
    if os.environ.get("REPLAG_NO_NATIVE"):
        raise ImportError("REPLAG_NO_NATIVE is set")
    from replag import _scanindex as _native
except ImportError:
    _native = None
NATIVE = _native is not None


def hash_each_python(items: list[bytes]) -> U64:
    return np.fromiter(map(xxhash.xxh3_64_intdigest, items), dtype=np.uint64, count=len(items))


def hash_each(items: list[bytes]) -> U64:
    """xxh3_64 of each item."""
    if _native is None:
        return hash_each_python(items)
    return np.frombuffer(_native.hash_each(items), dtype=np.uint64)


def string_index_python(
    keys: list[bytes], values: list[bytes]
) -> tuple[U64, U64, npt.NDArray[np.uint32], bytes]:
    key_hashes = hash_each_python(keys)
    entries = string_entry_hashes(key_hashes, hash_each_python(values))
    lengths = np.fromiter(map(len, keys), dtype=np.uint32, count=len(keys))
    return key_hashes, entries, lengths, b"".join(keys)


def string_index(
    keys: list[bytes], values: list[bytes]
) -> tuple[U64, U64, npt.NDArray[np.uint32], bytes]:
    """Key hashes, entry hashes, name lengths and the names joined, of a batch of strings
    without expiries."""
    if _native is None:
        return string_index_python(keys, values)
    hashes, entries, lengths, blob = _native.string_index(keys, values)
    return (
        np.frombuffer(hashes, dtype=np.uint64),
        np.frombuffer(entries, dtype=np.uint64),
        np.frombuffer(lengths, dtype=np.uint32),
        blob,
    )


def hash_names_python(blob: bytes, lengths: npt.NDArray[np.unsignedinteger[Any]]) -> U64:
    ends = np.cumsum(lengths, dtype=np.int64).tolist()
    starts = [0, *ends[:-1]]
    return hash_each_python([blob[a:b] for a, b in zip(starts, ends, strict=True)])


def hash_names(blob: bytes, lengths: npt.NDArray[np.unsignedinteger[Any]]) -> U64:
    """xxh3_64 of each name of `blob`, names laid end to end with these `lengths`."""
    if _native is None:
        return hash_names_python(blob, lengths)
    lengths = np.ascontiguousarray(lengths)
    return np.frombuffer(_native.hash_names(blob, lengths, lengths.dtype.itemsize), dtype=np.uint64)


def entries_with_top_python(arrays: list[U64], bits: int, top: int) -> U64:
    shift = np.uint64(64 - bits)
    parts = [a[(a >> shift) == np.uint64(top)] for a in arrays]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def entries_with_top(arrays: list[U64], bits: int, top: int) -> U64:
    """The values of all `arrays` whose top `bits` bits equal `top`, in order."""
    if _native is None:
        return entries_with_top_python(arrays, bits, top)
    return np.frombuffer(_native.entries_with_top(arrays, bits, top), dtype=np.uint64)
