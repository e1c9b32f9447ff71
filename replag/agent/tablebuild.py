"""A key table made while the full scan runs, without holding the scan's index.

The scanner hands each batch to `TableBuilder.add` (its sink). Every ~2 MiB of
names read, the builder files the batch by partition (the top 8 bits of the key
hash, 256 of them): each key's hash and entry hash go to its partition's columns
(in chunks of 2**15, 16 bytes a key), its name to one unlinked file, one block per
partition. At the end each partition in turn is sorted by hash, keeps the last
sighting of a key the scan returned twice (SCAN may, while the server resizes its
table; a duplicate would cancel itself in an XOR tree), is written into the
table's arrays (14 bytes a key, their pages touched only as they are filled) and
dropped, and has its names filed by bucket: the peak is the 16 bytes a key of the
columns and a partition's sort, not a sort of every key at once (~37 bytes a key).
"""

from __future__ import annotations

import os
import tempfile
from array import array
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

from replag.agent.keytable import KeyTable
from replag.agent.namefile import Piece, bucket_of, gather
from replag.private_files import private_dir
from replag.repair.keyspace.native import hash_names
from replag.repair.trees.index import ScanIndex

U64 = npt.NDArray[np.uint64]
PARTITION_BITS = 8
PARTITIONS = 1 << PARTITION_BITS
FLUSH_BYTES = 2 << 20
CHUNK = 1 << 15  # 256 KiB: above malloc's mmap threshold, so a dropped chunk is returned


class _Column:
    """uint64 values appended batch by batch, in chunks of `CHUNK` (each its own mapping)."""

    def __init__(self) -> None:
        self.chunks: list[U64] = []
        self.filled = 0  # in the last chunk

    def extend(self, values: U64) -> None:
        at = 0
        while at < len(values):
            if not self.chunks or self.filled == CHUNK:
                self.chunks.append(np.empty(CHUNK, np.uint64))
                self.filled = 0
            n = min(CHUNK - self.filled, len(values) - at)
            self.chunks[-1][self.filled : self.filled + n] = values[at : at + n]
            self.filled += n
            at += n

    def take(self) -> U64:
        """All values in one array; the chunks are dropped."""
        if not self.chunks:
            return np.zeros(0, np.uint64)
        self.chunks[-1] = self.chunks[-1][: self.filled]
        out = np.concatenate(self.chunks)
        self.chunks = []
        return out


class TableBuilder:
    """Collects a scan batch by batch (`add`), then makes the `KeyTable` (`finish`)."""

    def __init__(
        self,
        *,
        merge_every: int = 4096,
        directory: Path | None = None,
        flush_bytes: int = FLUSH_BYTES,
    ) -> None:
        self.merge_every = merge_every
        self.flush_bytes = flush_bytes
        self.directory = directory
        if directory is not None:
            private_dir(directory)
        # Per partition, the hashes and entry hashes of its keys in scan order.
        self._hashes = [_Column() for _ in range(PARTITIONS)]
        self._entries = [_Column() for _ in range(PARTITIONS)]
        self._pending: list[ScanIndex] = []
        self._pending_bytes = 0
        # Blocks of each partition in the spill file: offset, names, bytes of names, one
        # after the other (24 bytes a block; ~850 flushes x 256 blocks at 100M keys).
        self._blocks = [array("Q") for _ in range(PARTITIONS)]
        # Closed by `close` (or `finish`).
        self._spill: IO[bytes] = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115
        self._end = 0
        self.keys_seen = 0

    def add(self, part: ScanIndex) -> None:
        """One scan batch (the scanner's sink)."""
        if not len(part):
            return
        self.keys_seen += len(part)
        self._pending.append(part)
        self._pending_bytes += len(part.blob) + 4 * len(part)
        if self._pending_bytes >= self.flush_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        batch = ScanIndex.concat(self._pending)
        self._pending, self._pending_bytes = [], 0
        partition = (batch.key_hashes >> np.uint64(64 - PARTITION_BITS)).astype(np.int64)
        order = np.argsort(partition, kind="stable")
        lengths, blob = gather(batch.lengths, batch.blob, order)
        bounds = np.searchsorted(partition[order], np.arange(PARTITIONS + 1)).tolist()
        hashes, entries = batch.key_hashes[order], batch.entries[order]
        name_at = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).tolist()
        for p in range(PARTITIONS):
            a, b = bounds[p], bounds[p + 1]
            if a == b:
                continue
            self._hashes[p].extend(hashes[a:b])
            self._entries[p].extend(entries[a:b])
            head = lengths[a:b].astype("<u4").tobytes()
            names = blob[name_at[a] : name_at[b]]
            self._spill.write(head)
            self._spill.write(names)
            self._blocks[p].extend((self._end, b - a, len(names)))
            self._end += len(head) + len(names)

    def _partition(self, p: int) -> Piece:
        """Partition `p`'s names, each key once, in bucket order."""
        fd = self._spill.fileno()
        lengths: list[npt.NDArray[np.uint32]] = []
        blobs: list[bytes] = []
        blocks = self._blocks[p]
        for i in range(0, len(blocks), 3):
            offset, count, size = blocks[i], blocks[i + 1], blocks[i + 2]
            data = os.pread(fd, 4 * count + size, offset)
            if len(data) != 4 * count + size:
                raise OSError("spill file of the build ends early")
            lengths.append(np.frombuffer(data, "<u4", count).astype(np.uint32))
            blobs.append(data[4 * count :])
        self._blocks[p] = array("Q")
        if not lengths:
            return np.zeros(0, np.int64), np.zeros(0, np.uint32), b""
        names_lengths = np.concatenate(lengths)
        blob = b"".join(blobs)
        hashes = hash_names(blob, names_lengths)
        _, first = np.unique(hashes, return_index=True)  # sorted by hash, each key once
        picked_lengths, picked = gather(names_lengths, blob, first)
        return bucket_of(hashes[first]), picked_lengths, picked

    def finish(self) -> KeyTable:
        """The table of every key added (the last sighting of a key added twice)."""
        try:
            self._flush()
            self._spill.flush()
            table = KeyTable(merge_every=self.merge_every, directory=self.directory)
            table.reserve(self.keys_seen)
            count = 0
            for p in range(PARTITIONS):
                hashes, entries = self._sorted_partition(p)
                table.fill(count, hashes, entries)
                count += len(hashes)
            table.filled(count, (self._partition(p) for p in range(PARTITIONS)))
            return table
        finally:
            self.close()

    def _sorted_partition(self, p: int) -> tuple[U64, U64]:
        """Partition `p`'s hashes and entries, sorted by hash, each key once (its last
        sighting); its columns are dropped."""
        hashes = self._hashes[p].take()
        entries = self._entries[p].take()
        order = np.argsort(hashes, kind="stable")
        hashes, entries = hashes[order], entries[order]
        if len(hashes):
            # Stable: equal hashes stay in scan order, the last of each run is kept.
            last = np.ones(len(hashes), bool)
            last[:-1] = hashes[1:] != hashes[:-1]
            if not last.all():
                hashes, entries = hashes[last], entries[last]
        return hashes, entries

    def close(self) -> None:
        self._spill.close()
