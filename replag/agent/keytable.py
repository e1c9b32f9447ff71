"""What an agent remembers per key of one replica: key hash, entry hash and name, compactly.

Keeping a Tictac tree current means XORing a key's old entry hash out of its
leaf and the new one in, so the agent must know every key's current entry;
answering "which keys are in leaf i" needs the names too. A Python dict would
cost ~150 bytes a key; this table costs 22 bytes plus the name:

* a base of three numpy arrays sorted by key hash: hash (8 bytes), entry hash
  (8), offset of the name in the arena (4; 8 once the arena passes 4 GiB);
* the arena, one bytearray of names, each behind a 2-byte length (0xFFFF then
  4 bytes for a name of 64 KiB or more);
* a delta dict of the keys changed since the last merge (hash → (entry,
  offset), or None for a key deleted from the base), merged into the base with
  one sorted insert when it passes `merge_every` keys, so a write costs a dict
  operation and a merge is O(n) numpy work every few thousand writes.

Names of deleted keys stay in the arena until their garbage passes half of it,
when the arena is rewritten.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from replag.repair.trees.index import ScanIndex
from replag.repair.trees.tictac import TictacTree

U64 = npt.NDArray[np.uint64]
_LONG = 0xFFFF
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<QBQQ")
# A delta entry is a dict slot, a key int, a tuple and two ints: what it costs, roughly.
_DELTA_ENTRY_BYTES = 200


def _record(name: bytes) -> bytes:
    n = len(name)
    if n < _LONG:
        return _U16.pack(n) + name
    return _U16.pack(_LONG) + _U32.pack(n) + name


class KeyTable:
    """key hash → (entry hash, name) for every key of one replica."""

    def __init__(self, *, merge_every: int = 4096) -> None:
        self.hashes: U64 = np.zeros(0, np.uint64)
        self.entries: U64 = np.zeros(0, np.uint64)
        self.offsets: npt.NDArray[np.unsignedinteger] = np.zeros(0, np.uint32)
        self.arena = bytearray()
        self.delta: dict[int, tuple[int, int] | None] = {}
        self.merge_every = merge_every
        self.garbage = 0  # arena bytes of names no key refers to
        self._count = 0

    # --- building -------------------------------------------------------------

    @classmethod
    def from_index(cls, index: ScanIndex, *, merge_every: int = 4096) -> KeyTable:
        """The table of a (deduplicated) scan: names copied into the arena in one pass."""
        table = cls(merge_every=merge_every)
        n = len(index)
        if n == 0:
            return table
        order = np.argsort(index.key_hashes, kind="stable")
        table.hashes = index.key_hashes[order]
        table.entries = index.entries[order]
        lengths = index.lengths.astype(np.int64)
        if int(lengths.max()) >= _LONG:
            records = [_record(index.key(i)) for i in range(n)]
            table.arena = bytearray(b"".join(records))
            starts = np.concatenate([[0], np.cumsum([len(r) for r in records])[:-1]])
        else:
            # Vectorised: every record is 2 length bytes then the name, in scan order.
            starts = np.concatenate([[0], np.cumsum(lengths + 2)[:-1]]).astype(np.int64)
            arena = np.empty(int(lengths.sum()) + 2 * n, np.uint8)
            is_name = np.ones(len(arena), bool)
            is_name[starts] = False
            is_name[starts + 1] = False
            arena[starts] = (lengths & 0xFF).astype(np.uint8)
            arena[starts + 1] = (lengths >> 8).astype(np.uint8)
            arena[is_name] = np.frombuffer(index.blob, np.uint8)
            table.arena = bytearray(arena.tobytes())
        table.offsets = np.asarray(starts, np.int64)[order].astype(table._offset_dtype())
        table._count = n
        return table

    def _offset_dtype(self) -> type[np.unsignedinteger]:
        return np.uint32 if len(self.arena) < 2**32 else np.uint64

    # --- reading --------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def name_at(self, offset: int) -> bytes:
        (n,) = _U16.unpack_from(self.arena, offset)
        if n < _LONG:
            return bytes(self.arena[offset + 2 : offset + 2 + n])
        (n,) = _U32.unpack_from(self.arena, offset + 2)
        return bytes(self.arena[offset + 6 : offset + 6 + n])

    def names_at(self, offsets: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.uint32], bytes]:
        """The names at `offsets`: their lengths and the names concatenated (vectorised:
        a check asks for tens of thousands at once)."""
        if not len(offsets):
            return np.zeros(0, np.uint32), b""
        arena = np.frombuffer(self.arena, np.uint8)
        lengths = arena[offsets].astype(np.int64) | (arena[offsets + 1].astype(np.int64) << 8)
        if (lengths == _LONG).any():  # a name of 64 KiB or more: rare, read one by one
            names = [self.name_at(int(o)) for o in offsets.tolist()]
            return np.fromiter(map(len, names), np.uint32, count=len(names)), b"".join(names)
        starts = offsets + 2
        ends = np.cumsum(lengths)
        index = np.repeat(starts - (ends - lengths), lengths) + np.arange(int(ends[-1]))
        return lengths.astype(np.uint32), arena[index].tobytes()

    def _record_size(self, offset: int) -> int:
        (n,) = _U16.unpack_from(self.arena, offset)
        if n < _LONG:
            return 2 + int(n)
        (n,) = _U32.unpack_from(self.arena, offset + 2)
        return 6 + int(n)

    def lookup(self, hashes: U64) -> tuple[U64, npt.NDArray[np.int64]]:
        """(entry, name offset) per hash; offset -1 where the table does not hold the key."""
        entries = np.zeros(len(hashes), np.uint64)
        offsets = np.full(len(hashes), -1, np.int64)
        if len(self.hashes):
            pos = np.minimum(np.searchsorted(self.hashes, hashes), len(self.hashes) - 1)
            found = self.hashes[pos] == hashes
            entries[found] = self.entries[pos[found]]
            offsets[found] = self.offsets[pos[found]].astype(np.int64)
        if self.delta:
            delta = self.delta
            for i, h in enumerate(hashes.tolist()):
                if h in delta:
                    item = delta[h]
                    if item is None:
                        entries[i], offsets[i] = 0, -1
                    else:
                        entries[i], offsets[i] = item
        return entries, offsets

    def keys_in_leaves(
        self, leaves: Sequence[int] | npt.NDArray[np.int64], depth: int
    ) -> ScanIndex:
        """Every key whose hash falls in one of `leaves` (leaf numbers of a 2**depth tree)."""
        leaves = np.unique(np.asarray(leaves, np.int64))
        if not len(leaves):
            return ScanIndex.empty()
        shift = 64 - depth
        picked = np.zeros(0, np.int64)
        if len(self.hashes):
            lo = np.searchsorted(self.hashes, leaves.astype(np.uint64) << np.uint64(shift))
            nxt = leaves + 1
            hi = np.full(len(leaves), len(self.hashes), np.int64)
            inner = nxt < (1 << depth)
            hi[inner] = np.searchsorted(
                self.hashes, nxt[inner].astype(np.uint64) << np.uint64(shift)
            )
            sizes = hi - lo
            if sizes.sum():
                # Concatenated ranges [lo, hi) without a Python loop.
                starts = np.repeat(lo - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
                picked = starts + np.arange(int(sizes.sum()))
        hashes = self.hashes[picked]
        entries = self.entries[picked]
        offsets = self.offsets[picked].astype(np.int64)
        if self.delta:
            keep = np.array([h not in self.delta for h in hashes.tolist()], bool)
            hashes, entries, offsets = hashes[keep], entries[keep], offsets[keep]
            wanted = set(leaves.tolist())
            extra = [
                (h, item[0], item[1])
                for h, item in self.delta.items()
                if item is not None and (h >> shift) in wanted
            ]
            if extra:
                hashes = np.concatenate([hashes, np.array([e[0] for e in extra], np.uint64)])
                entries = np.concatenate([entries, np.array([e[1] for e in extra], np.uint64)])
                offsets = np.concatenate([offsets, np.array([e[2] for e in extra], np.int64)])
        lengths, blob = self.names_at(offsets)
        return ScanIndex(hashes, entries, lengths, blob)

    def tree(self, depth: int) -> TictacTree:
        """The Tictac tree of every key in the table."""
        tree = TictacTree(depth)
        tree.add(self.hashes, self.entries)
        if self.delta:
            # Base entries replaced or deleted by the delta come out, delta entries go in.
            hashes = np.fromiter(self.delta.keys(), np.uint64, count=len(self.delta))
            pos = np.minimum(np.searchsorted(self.hashes, hashes), max(len(self.hashes) - 1, 0))
            if len(self.hashes):
                in_base = self.hashes[pos] == hashes
                tree.add(hashes[in_base], self.entries[pos[in_base]])
            live = [(h, item[0]) for h, item in self.delta.items() if item is not None]
            if live:
                tree.add(
                    np.array([h for h, _ in live], np.uint64),
                    np.array([e for _, e in live], np.uint64),
                )
        return tree

    @property
    def nbytes(self) -> int:
        """Memory held: the arrays, the arena, and an estimate for the delta dict."""
        return (
            self.hashes.nbytes
            + self.entries.nbytes
            + self.offsets.nbytes
            + sys.getsizeof(self.arena)
            + _DELTA_ENTRY_BYTES * len(self.delta)
        )

    def bytes_per_key(self) -> float:
        return self.nbytes / len(self) if len(self) else 0.0

    # --- changing -------------------------------------------------------------

    def apply(
        self,
        hashes: U64,
        entries: U64,
        present: npt.NDArray[np.bool_],
        names: Iterable[bytes],
        *,
        tree: TictacTree | None = None,
    ) -> None:
        """Set the keys that are `present` to their new entry, drop the others; XOR the
        change into `tree`'s leaves (old entry out, new entry in). Hashes must be distinct."""
        old, offsets = self.lookup(hashes)
        if tree is not None:
            new = np.where(present, entries, np.uint64(0))
            changed = (old ^ new) != 0
            tree.add(hashes[changed], (old ^ new)[changed])
        delta = self.delta
        for h, entry, is_present, offset, name in zip(
            hashes.tolist(),
            entries.tolist(),
            present.tolist(),
            offsets.tolist(),
            names,
            strict=True,
        ):
            if is_present:
                if offset < 0:
                    offset = len(self.arena)
                    self.arena += _record(name)
                    self._count += 1
                delta[h] = (entry, offset)
            elif offset >= 0:
                self.garbage += self._record_size(offset)
                self._count -= 1
                delta[h] = None
        if len(delta) >= self.merge_every:
            self.merge()

    def merge(self) -> None:
        """Fold the delta into the sorted base arrays (and rewrite the arena when half garbage)."""
        if self.delta:
            items = self.delta
            self.delta = {}
            dh = np.fromiter(items.keys(), np.uint64, count=len(items))
            keep = np.ones(len(self.hashes), bool)
            if len(self.hashes):
                pos = np.minimum(np.searchsorted(self.hashes, dh), len(self.hashes) - 1)
                in_base = self.hashes[pos] == dh
                keep[pos[in_base]] = False
            live = [(h, e, o) for h, item in items.items() if item is not None for e, o in (item,)]
            add_h = np.array([x[0] for x in live], np.uint64)
            order = np.argsort(add_h, kind="stable")
            add_h = add_h[order]
            add_e = np.array([x[1] for x in live], np.uint64)[order]
            add_o = np.array([x[2] for x in live], np.int64)[order]
            kept_h = self.hashes[keep]
            at = np.searchsorted(kept_h, add_h)
            dtype = self._offset_dtype()
            self.hashes = np.insert(kept_h, at, add_h)
            self.entries = np.insert(self.entries[keep], at, add_e)
            self.offsets = np.insert(self.offsets[keep].astype(dtype), at, add_o.astype(dtype))
        if self.garbage > (1 << 20) and self.garbage * 2 > len(self.arena):
            self._rewrite_arena()

    def _rewrite_arena(self) -> None:
        assert not self.delta
        arena = bytearray()
        offsets = np.empty(len(self.offsets), np.int64)
        for i, offset in enumerate(self.offsets.tolist()):
            offsets[i] = len(arena)
            size = self._record_size(offset)
            arena += self.arena[offset : offset + size]
        self.arena = arena
        self.offsets = offsets.astype(self._offset_dtype())
        self.garbage = 0

    # --- persistence ----------------------------------------------------------

    def to_bytes(self) -> bytes:
        """count, offset width, arena size, garbage, then hashes, entries, offsets, arena."""
        self.merge()
        width = self.offsets.dtype.itemsize
        return b"".join(
            [
                _HEAD.pack(len(self.hashes), width, len(self.arena), self.garbage),
                self.hashes.astype("<u8").tobytes(),
                self.entries.astype("<u8").tobytes(),
                self.offsets.astype(f"<u{width}").tobytes(),
                bytes(self.arena),
            ]
        )

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, *, merge_every: int = 4096) -> KeyTable:
        n, width, arena_size, garbage = _HEAD.unpack_from(data)
        at = _HEAD.size
        table = cls(merge_every=merge_every)
        table.hashes = np.frombuffer(data, "<u8", n, at).astype(np.uint64)
        table.entries = np.frombuffer(data, "<u8", n, at + 8 * n).astype(np.uint64)
        table.offsets = np.frombuffer(data, f"<u{width}", n, at + 16 * n).astype(
            np.uint32 if width == 4 else np.uint64
        )
        start = at + 16 * n + width * n
        table.arena = bytearray(data[start : start + arena_size])
        if len(table.arena) != arena_size:
            raise ValueError("truncated key table")
        table._count = n
        table.garbage = garbage
        return table
