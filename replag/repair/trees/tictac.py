"""Tictac Merkle trees: XOR trees over 64-bit key hashes, built with numpy.

Leaf i holds the XOR of the entry hashes of the keys whose key hash has i as
its top `depth` bits; an inner node is the XOR of its two children. XOR makes
a tree independent of the order keys were added, lets segments scanned
separately be merged, and lets a key be removed by adding it again.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from replag.errors import RepairError

U64 = npt.NDArray[np.uint64]
_MAGIC = b"TTAC"
_HEADER = struct.Struct("<4sBB")  # magic, format version, depth
DEFAULT_DEPTH = 16


def leaf_of(key_hashes: U64, depth: int) -> npt.NDArray[np.int64]:
    return (key_hashes >> np.uint64(64 - depth)).astype(np.int64)


class TictacTree:
    """2**depth leaves of uint64; equal trees hold equal (key, entry) sets, whp."""

    def __init__(self, depth: int = DEFAULT_DEPTH, leaves: U64 | None = None) -> None:
        if not 1 <= depth <= 24:
            raise ValueError(f"tree depth must be 1..24, got {depth}")
        if leaves is None:
            leaves = np.zeros(1 << depth, dtype=np.uint64)
        elif leaves.shape != (1 << depth,):
            raise ValueError("leaf array does not match the depth")
        self.depth = depth
        self.leaves = leaves

    def add(self, key_hashes: U64, entries: U64) -> None:
        """XOR each entry into the leaf of its key (adding an entry twice removes it)."""
        np.bitwise_xor.at(self.leaves, leaf_of(key_hashes, self.depth), entries)

    def merge(self, other: TictacTree) -> TictacTree:
        """The tree of both segments' keys (segments must not share keys)."""
        if other.depth != self.depth:
            raise ValueError(f"cannot merge trees of depth {self.depth} and {other.depth}")
        return TictacTree(self.depth, self.leaves ^ other.leaves)

    def levels(self) -> list[U64]:
        """Level 0 is the root (one node), the last level the leaves."""
        out = [self.leaves]
        while len(out[-1]) > 1:
            below = out[-1]
            out.append(below[0::2] ^ below[1::2])
        return out[::-1]

    @property
    def root(self) -> int:
        return int(np.bitwise_xor.reduce(self.leaves))

    def to_bytes(self) -> bytes:
        return _HEADER.pack(_MAGIC, 1, self.depth) + self.leaves.astype("<u8").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> TictacTree:
        try:
            magic, version, depth = _HEADER.unpack_from(data)
        except struct.error:
            raise RepairError("not a serialised Tictac tree (too short)") from None
        if magic != _MAGIC or version != 1:
            raise RepairError("not a serialised Tictac tree (bad header)")
        leaves = np.frombuffer(data, dtype="<u8", offset=_HEADER.size).astype(np.uint64)
        if leaves.shape != (1 << depth,):
            raise RepairError("serialised Tictac tree is truncated")
        return cls(depth, leaves)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TictacTree)
            and other.depth == self.depth
            and bool(np.array_equal(self.leaves, other.leaves))
        )

    def __repr__(self) -> str:
        return f"TictacTree(depth={self.depth}, root={self.root:#018x})"


def differing_leaves(trees: Sequence[TictacTree]) -> npt.NDArray[np.int64]:
    """Leaves where the trees do not all agree, walking down only from differing nodes."""
    if not trees:
        return np.zeros(0, dtype=np.int64)
    depth = trees[0].depth
    if any(t.depth != depth for t in trees):
        raise ValueError("trees of different depths cannot be compared")
    all_levels = [t.levels() for t in trees]
    nodes = np.zeros(1, dtype=np.int64)  # the root
    for level in range(depth + 1):
        values = np.stack([levels[level][nodes] for levels in all_levels])
        nodes = nodes[np.any(values != values[0], axis=0)]
        if level < depth and len(nodes):
            nodes = np.concatenate([2 * nodes, 2 * nodes + 1])
            nodes.sort()
    return nodes
