"""What an agent remembers per key of one replica: 14 bytes in memory, the name on disk.

Keeping a Tictac tree current means XORing a key's old entry hash out of its
leaf and the new one in, so the agent must know every key's current entry
hash; answering "which keys are in leaf i" needs the names too, but only then.

In memory, per key: its entry hash (8 bytes) and the low 48 bits of its key
hash (a 4-byte and a 2-byte array), sorted by key hash. The top 16 bits are
not stored: the arrays are cut into 2**16 buckets by an index of where each
starts (`starts`, 512 KiB at any key count), so a key's full 64-bit hash, its
identity everywhere in replag (a scan's deduplication, the trees' leaves), is
known exactly: no two keys are ever merged or lost here unless their 64-bit
hashes are equal, which a scan would merge too. A lookup is a binary search
within the key's bucket, vectorised over a batch.

A delta dict holds the keys changed since the last merge (key hash → entry
hash, or None for a key deleted), folded into the sorted arrays with one
sorted insert when it passes `merge_every` keys or 1/1024 of the table: a
write costs a dict operation, a merge O(n) numpy work now and then.

On disk (`NameFile`): the names, grouped by bucket, read only for the buckets
a check asks for, hashed again, and kept where the table holds that hash.
Keys added since the file was written are in its log; once the log and the
names of deleted keys pass an eighth of the keys (`rewrite_due`), the owner
rewrites the file with the live keys alone (`rewrite_names_async` in the
live tree's task). `tablebuild` makes a table while a scan runs.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

from replag.agent.namefile import (
    BUCKET_BITS,
    BUCKETS,
    NameFile,
    NameFileWriter,
    Piece,
    bucket_of,
    gather,
)
from replag.repair.keyspace.native import hash_names
from replag.repair.trees.index import ScanIndex
from replag.repair.trees.tictac import TictacTree

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
_REST = np.uint64((1 << (64 - BUCKET_BITS)) - 1)
_SIXTEEN = np.uint64(16)
TREE_BUCKETS = 1024  # buckets whose full hashes `tree` makes at once (1/64 of the keys)
_HEAD = struct.Struct("<4sQ")
_MAGIC = b"RKT2"
# A delta entry is a dict slot, a key int and an int: what it costs, roughly.
_DELTA_ENTRY_BYTES = 120
# The names file is rewritten once its log and dead names pass this share of the keys.
REWRITE_SHARE = 8
REWRITE_FLOOR = 65536


def _find(
    starts: I64, hi: npt.NDArray[np.uint32], lo: npt.NDArray[np.uint16], hashes: U64
) -> tuple[I64, npt.NDArray[np.bool_]]:
    """Where each hash is (or would go) in arrays sorted by hash, and whether it is there."""
    buckets = bucket_of(hashes)
    rest = hashes & _REST
    low = starts[buckets]
    high = starts[buckets + 1]
    end = high.copy()
    last = max(len(hi) - 1, 0)
    active = low < high
    while active.any():
        mid = (low + high) // 2
        at = np.minimum(mid, last)
        value = (hi[at].astype(np.uint64) << _SIXTEEN) | lo[at].astype(np.uint64)
        less = value < rest
        low = np.where(active & less, mid + 1, low)
        high = np.where(active & ~less, mid, high)
        active = low < high
    found = low < end
    if found.any():
        at = np.minimum(low, last)
        value = (hi[at].astype(np.uint64) << _SIXTEEN) | lo[at].astype(np.uint64)
        found &= value == rest
    return low, found


def _split(hashes: U64) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint16]]:
    rest = hashes & _REST
    return (rest >> _SIXTEEN).astype(np.uint32), (rest & np.uint64(0xFFFF)).astype(np.uint16)


def _leaf_buckets(leaves: I64, depth: int) -> list[tuple[int, int]]:
    """The bucket ranges [first, stop) that hold the leaves of a 2**depth tree, merged."""
    if depth <= BUCKET_BITS:
        shift = BUCKET_BITS - depth
        firsts, stops = leaves << shift, (leaves + 1) << shift
    else:
        firsts = np.unique(leaves >> (depth - BUCKET_BITS))
        stops = firsts + 1
    spans: list[tuple[int, int]] = []
    for first, stop in zip(firsts.tolist(), stops.tolist(), strict=True):
        if spans and spans[-1][1] == first:
            spans[-1] = (spans[-1][0], stop)
        else:
            spans.append((first, stop))
    return spans


@dataclass
class TableImage:
    """A table frozen for saving in another thread: its arrays (never changed in place)
    and a dup of its names file's descriptor (the base is never written over)."""

    starts: I64
    hi: npt.NDArray[np.uint32]
    lo: npt.NDArray[np.uint16]
    entries: U64
    names: NameFile
    fd: int

    def __len__(self) -> int:
        return len(self.entries)

    def write(self, out: IO[bytes]) -> None:
        """magic, count; starts, hi, lo, entries; the names' bucket index; their base."""
        try:
            out.write(_HEAD.pack(_MAGIC, len(self.entries)))
            for array, dtype in (
                (self.starts, "<i8"),
                (self.hi, "<u4"),
                (self.lo, "<u2"),
                (self.entries, "<u8"),
                (self.names.offsets, "<i8"),
            ):
                out.write(np.ascontiguousarray(array, dtype).data)
            self.names.base_to(out, self.fd)
        finally:
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _read_array(source: IO[bytes], dtype: str, count: int) -> npt.NDArray[np.generic]:
    size = np.dtype(dtype).itemsize * count
    data = source.read(size)
    if len(data) != size:
        raise ValueError("key table truncated")
    return np.frombuffer(data, dtype)


class KeyTable:
    """key hash → entry hash for every key of one replica, names on disk."""

    def __init__(self, *, merge_every: int = 4096, directory: Path | None = None) -> None:
        self.starts: I64 = np.zeros(BUCKETS + 1, np.int64)
        self.hi: npt.NDArray[np.uint32] = np.zeros(0, np.uint32)
        self.lo: npt.NDArray[np.uint16] = np.zeros(0, np.uint16)
        self.entries: U64 = np.zeros(0, np.uint64)
        self.delta: dict[int, int | None] = {}
        self.merge_every = merge_every
        self.directory = directory
        self.names = NameFile(directory)
        self.dead = 0  # names in the file of keys deleted since it was written
        self.rewrite_floor = REWRITE_FLOOR
        self.rewrite_share = REWRITE_SHARE
        self._count = 0

    # --- building -------------------------------------------------------------

    @classmethod
    def from_index(
        cls, index: ScanIndex, *, merge_every: int = 4096, directory: Path | None = None
    ) -> KeyTable:
        """The table of a (deduplicated) scan; its names written to disk in bucket order."""
        n = len(index)
        order = np.argsort(index.key_hashes, kind="stable")
        hashes = index.key_hashes[order]

        def pieces() -> Iterator[Piece]:
            for at in range(0, n, 1 << 18):
                picks = order[at : at + (1 << 18)]
                lengths, blob = gather(index.lengths, index.blob, picks)
                yield bucket_of(hashes[at : at + len(picks)]), lengths, blob

        return cls.from_sorted(
            hashes, index.entries[order], pieces(), merge_every=merge_every, directory=directory
        )

    @classmethod
    def from_sorted(
        cls,
        hashes: U64,
        entries: U64,
        names: Iterable[Piece],
        *,
        merge_every: int = 4096,
        directory: Path | None = None,
    ) -> KeyTable:
        """The table of distinct keys sorted by hash, their names given in bucket order
        (`NameFile.build`)."""
        table = cls(merge_every=merge_every, directory=directory)
        table.reserve(len(hashes))
        table.fill(0, hashes, entries)
        table.filled(len(hashes), names)
        return table

    def reserve(self, capacity: int) -> None:
        """Arrays for up to `capacity` keys, filled in hash order by `fill`, then `filled`
        (`tablebuild`: one partition at a time; a page is touched only once filled)."""
        self.hi = np.empty(capacity, np.uint32)
        self.lo = np.empty(capacity, np.uint16)
        self.entries = np.empty(capacity, np.uint64)
        self.starts = np.zeros(BUCKETS + 1, np.int64)  # each bucket's count, until `filled`

    def fill(self, at: int, hashes: U64, entries: U64) -> None:
        """Distinct keys `at`.. of the table, sorted by hash, above every hash before."""
        end = at + len(hashes)
        self.hi[at:end], self.lo[at:end] = _split(hashes)
        self.entries[at:end] = entries
        self.starts[1:] += np.bincount(bucket_of(hashes), minlength=BUCKETS)

    def filled(self, count: int, names: Iterable[Piece]) -> None:
        """The `count` keys filled are the table; their names given in bucket order."""
        self.hi, self.lo, self.entries = self.hi[:count], self.lo[:count], self.entries[:count]
        np.cumsum(self.starts, out=self.starts)
        self.names.close()
        self.names = NameFile.build(self.directory, count, names)
        self._count = count

    def close(self) -> None:
        """Drop the names file (its space goes back to the file system)."""
        self.names.close()

    # --- reading --------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def _base_hashes(self, first: int, stop: int) -> U64:
        """The full hashes of the base keys of buckets [first, stop)."""
        counts = np.diff(self.starts[first : stop + 1])
        hashes: U64 = np.repeat(np.arange(first, stop, dtype=np.uint64), counts)
        hashes <<= np.uint64(64 - BUCKET_BITS)
        a, b = int(self.starts[first]), int(self.starts[stop])
        hashes |= self.hi[a:b].astype(np.uint64) << _SIXTEEN
        hashes |= self.lo[a:b].astype(np.uint64)
        return hashes

    def lookup(self, hashes: U64) -> tuple[U64, npt.NDArray[np.bool_]]:
        """(entry, held) per hash; entry 0 where the table does not hold the key."""
        pos, found = _find(self.starts, self.hi, self.lo, hashes)
        entries = np.zeros(len(hashes), np.uint64)
        entries[found] = self.entries[pos[found]]
        if self.delta:
            delta = self.delta
            changed = np.flatnonzero(
                np.isin(hashes, np.fromiter(delta, np.uint64, count=len(delta)))
            )
            for i in changed.tolist():
                item = delta[int(hashes[i])]
                entries[i] = 0 if item is None else item
                found[i] = item is not None
        return entries, found

    def keys_in_leaves(self, leaves: Sequence[int] | I64, depth: int) -> ScanIndex:
        """Every key whose hash falls in one of `leaves` (leaf numbers of a 2**depth tree),
        grouped by bucket (in no order within one)."""
        wanted = np.unique(np.asarray(leaves, np.int64))
        if not len(wanted) or not self._count:
            return ScanIndex.empty()
        parts = [
            self._live_names(*self.names.read(batch), wanted, depth)
            for batch in self.names.batches(_leaf_buckets(wanted, depth))
        ]
        return ScanIndex.concat(parts) if len(parts) != 1 else parts[0]

    def _live_names(
        self, lengths: npt.NDArray[np.uint32], blob: bytes, leaves: I64 | None, depth: int
    ) -> ScanIndex:
        """Of names read from the file, each live key once (with its entry)."""
        if not len(lengths):
            return ScanIndex.empty()
        hashes = hash_names(blob, lengths)
        entries, keep = self.lookup(hashes)
        if leaves is not None and depth > BUCKET_BITS:
            keep &= np.isin((hashes >> np.uint64(64 - depth)).astype(np.int64), leaves)
        picks = np.flatnonzero(keep)
        _, first = np.unique(hashes[picks], return_index=True)  # a key filed twice
        picks = picks[np.sort(first)]
        if len(picks) == len(hashes):  # every name live, once: as read
            return ScanIndex(hashes, entries, lengths, blob)
        names_lengths, names = gather(lengths, blob, picks)
        return ScanIndex(hashes[picks], entries[picks], names_lengths, names)

    def tree(self, depth: int) -> TictacTree:
        """The Tictac tree of every key in the table."""
        tree = TictacTree(depth)
        # A slice of the buckets at a time: the full hashes cost 8 bytes a key while made,
        # three times over (more than the table's 14), never for every key at once.
        for first in range(0, BUCKETS, TREE_BUCKETS):
            stop = min(BUCKETS, first + TREE_BUCKETS)
            a, b = int(self.starts[first]), int(self.starts[stop])
            tree.add(self._base_hashes(first, stop), self.entries[a:b])
        if self.delta:
            # Base entries replaced or deleted by the delta come out, delta entries go in.
            hashes = np.fromiter(self.delta.keys(), np.uint64, count=len(self.delta))
            pos, in_base = _find(self.starts, self.hi, self.lo, hashes)
            tree.add(hashes[in_base], self.entries[pos[in_base]])
            live = [(h, e) for h, e in self.delta.items() if e is not None]
            if live:
                tree.add(
                    np.array([h for h, _ in live], np.uint64),
                    np.array([e for _, e in live], np.uint64),
                )
        return tree

    @property
    def nbytes(self) -> int:
        """Memory held: the arrays, the names file's indexes, an estimate for the delta."""
        return (
            self.starts.nbytes
            + self.hi.nbytes
            + self.lo.nbytes
            + self.entries.nbytes
            + self.names.nbytes
            + _DELTA_ENTRY_BYTES * len(self.delta)
        )

    @property
    def fixed_bytes(self) -> int:
        """Memory held at any key count: the bucket indexes."""
        return self.starts.nbytes + self.names.records.nbytes + self.names.offsets.nbytes

    def bytes_per_key(self) -> float:
        """Memory per key beyond the fixed bucket indexes."""
        return (self.nbytes - self.fixed_bytes) / len(self) if len(self) else 0.0

    @property
    def disk_bytes(self) -> int:
        return self.names.disk_bytes

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
        old, held = self.lookup(hashes)
        if tree is not None:
            new = np.where(present, entries, np.uint64(0))
            changed = (old ^ new) != 0
            tree.add(hashes[changed], (old ^ new)[changed])
        delta = self.delta
        for h, entry, is_present, was_held, name in zip(
            hashes.tolist(), entries.tolist(), present.tolist(), held.tolist(), names, strict=True
        ):
            if is_present:
                if not was_held:
                    self.names.append(h, name)
                    self._count += 1
                delta[h] = entry
            elif was_held:
                self._count -= 1
                self.dead += 1
                delta[h] = None
        # A merge copies the arrays: at least every `merge_every` keys, at most ~1/1024
        # of the table's bytes copied per key changed (at 100M keys: every ~100k).
        if len(delta) >= max(self.merge_every, self._count >> 10):
            self.merge()

    def merge(self) -> None:
        """Fold the delta into the sorted arrays."""
        if self.delta:
            items = self.delta
            self.delta = {}
            dh = np.fromiter(items.keys(), np.uint64, count=len(items))
            pos, in_base = _find(self.starts, self.hi, self.lo, dh)
            keep = np.ones(len(self.entries), bool)
            keep[pos[in_base]] = False
            removed = np.bincount(bucket_of(dh[in_base]), minlength=BUCKETS)
            starts = self.starts.copy()
            starts[1:] -= np.cumsum(removed)
            hi, lo, entries = self.hi[keep], self.lo[keep], self.entries[keep]
            live = [(h, e) for h, e in items.items() if e is not None]
            add_h = np.array([h for h, _ in live], np.uint64)
            order = np.argsort(add_h, kind="stable")
            add_h = add_h[order]
            add_e = np.array([e for _, e in live], np.uint64)[order]
            at, _ = _find(starts, hi, lo, add_h)
            add_hi, add_lo = _split(add_h)
            self.hi = np.insert(hi, at, add_hi)
            self.lo = np.insert(lo, at, add_lo)
            self.entries = np.insert(entries, at, add_e)
            starts[1:] += np.cumsum(np.bincount(bucket_of(add_h), minlength=BUCKETS))
            self.starts = starts

    @property
    def rewrite_due(self) -> bool:
        """Whether the names file's log and dead names passed an eighth of the keys (the
        owner then calls `rewrite_names`, or `rewrite_names_async` in an event loop)."""
        limit = max(self.rewrite_floor, self._count // self.rewrite_share)
        return self.names.logged + self.dead > limit

    def _rewrite_pieces(self, old: NameFile) -> Iterator[Piece]:
        for first, stop in old.spans(0, BUCKETS):
            live = self._live_names(*old.read([(first, stop)]), None, 0)
            order = np.argsort(bucket_of(live.key_hashes), kind="stable")
            lengths, blob = gather(live.lengths, live.blob, order)
            yield bucket_of(live.key_hashes[order]), lengths, blob

    def rewrite_names(self) -> None:
        """A new names file holding each live key's name once, in bucket order."""
        self._swap(NameFile.build(self.directory, self._count, self._rewrite_pieces(self.names)))

    async def rewrite_names_async(self) -> None:
        """`rewrite_names` a piece (~256k names) at a time, the event loop free between
        pieces: the caller must not change the table meanwhile (readers may read it)."""
        writer = NameFileWriter(self.directory, self._count)
        try:
            for piece in self._rewrite_pieces(self.names):
                writer.add(piece)
                await asyncio.sleep(0)
        except BaseException:
            writer.abandon()
            raise
        self._swap(writer.finish())

    def _swap(self, names: NameFile) -> None:
        old, self.names = self.names, names
        self.dead = 0
        old.close()

    # --- persistence ----------------------------------------------------------

    @property
    def names_exact(self) -> bool:
        """Whether the names file's base holds the live keys alone (none added, none
        deleted since it was written)."""
        return not (self.names.logged or self.dead)

    def image(self) -> TableImage:
        """The table as it is now, for `TableImage.write` in another thread (merged, and
        the names file rewritten unless `names_exact`, so that its base holds exactly
        the live keys)."""
        self.merge()
        if not self.names_exact:
            self.rewrite_names()
        return TableImage(
            self.starts, self.hi, self.lo, self.entries, self.names, os.dup(self.names.fd)
        )

    @classmethod
    def read_from(
        cls, source: IO[bytes], *, merge_every: int = 4096, directory: Path | None = None
    ) -> KeyTable:
        """A table from what `TableImage.write` wrote (ValueError when it is damaged)."""
        head = source.read(_HEAD.size)
        if len(head) != _HEAD.size:
            raise ValueError("key table truncated")
        magic, n = _HEAD.unpack(head)
        if magic != _MAGIC:
            raise ValueError("not a key table")
        table = cls(merge_every=merge_every, directory=directory)
        starts = _read_array(source, "<i8", BUCKETS + 1).astype(np.int64)
        hi = _read_array(source, "<u4", n).astype(np.uint32)
        lo = _read_array(source, "<u2", n).astype(np.uint16)
        entries = _read_array(source, "<u8", n).astype(np.uint64)
        offsets = _read_array(source, "<i8", BUCKETS + 1).astype(np.int64)
        if int(starts[0]) != 0 or int(starts[-1]) != n or bool((np.diff(starts) < 0).any()):
            raise ValueError("key table: bucket index damaged")
        table.starts, table.hi, table.lo, table.entries = starts, hi, lo, entries
        table.names.close()
        table.names = NameFile.base_from(directory, source, n, starts.copy(), offsets)
        table._count = n
        return table
