"""A scan process's keys, in bounded memory: chunks spilled to a private temporary file.

A full check keeps, per key of a member, its entry hash and its name, so the
walk can ask for the keys of the leaves that differ (`KeptKeys.in_leaves`).
Held in memory that grew with the keyspace (~25 bytes a key per member). Here
the keys are gathered into chunks of at most `KeepLimits.memory_bytes`; a full
chunk is written to a file and dropped from memory, so a scan process holds one
chunk (and a sorted copy of its entries) whatever the keyspace. A keyspace that
fits in one chunk never touches the disk.

The file: made by `tempfile.TemporaryFile` (O_TMPFILE on Linux: it has no name,
mode 0600, in `$TMPDIR` or the directory named), so nothing is left on disk once
the process ends, however it ends (a kill included). Per key it holds the entry
hash twice (in name order, and sorted) and the name with its length: 17 bytes
plus the name. It grows to at most `KeepLimits.disk_bytes`: a keyspace that would
pass that stops being kept (the file is dropped), and the walk's leaves are then
read again from the replica by a second pass over only those leaves, as a
resumed scan's are (`KeptKeys.kept` is then False).

Each chunk's entries are also written sorted, with where each value of their
top byte starts (257 offsets), so the duplicates SCAN returned (while the
server resized its table) are found by sorting one range of top bytes at a time
across all chunks, each range's entries at most one chunk's worth.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from replag.repair.keyspace.native import hash_each, hash_names
from replag.repair.trees.index import ScanIndex
from replag.repair.trees.tictac import TictacTree, leaf_of

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
_TOP_SHIFT = np.uint64(56)


@dataclass(frozen=True)
class KeepLimits:
    """What a scan process may use for the keys it keeps."""

    # Keys held at most: a chunk being gathered, then its entries joined and sorted.
    memory_bytes: int = 16 << 20
    disk_bytes: int = 8 << 30  # the spill file; past it the keys are not kept
    directory: str | None = None  # None: tempfile's ($TMPDIR, else /tmp)


@dataclass(slots=True)
class _Chunk:
    n: int
    itemsize: int  # bytes per name length
    blob_size: int
    # Offset in the file of entries, lengths, blob, sorted entries and `bounds`; -1: held.
    at: int = -1
    held: tuple[U64, npt.NDArray[Any], bytes, U64] | None = field(default=None, repr=False)
    # Where each top byte's run starts in the sorted entries (257): kept here only for a
    # chunk held (a spilled chunk's are in the file: ~100 bytes a chunk here, not 2 kB,
    # so that thousands of small chunks at a low budget stay small).
    bounds: I64 | None = field(default=None, repr=False)

    @property
    def record_size(self) -> int:
        return self.n * (8 + self.itemsize) + self.blob_size


class KeptKeys:
    """A member's keys as a scan read them: per key its entry hash and its name (key
    hashes, and so leaves, are recomputed from the names, in C, when asked for)."""

    def __init__(self, depth: int, limits: KeepLimits | None = None) -> None:
        self.depth = depth
        self.limits = limits if limits is not None else KeepLimits()
        self.tree = TictacTree(depth)
        self.kept = True  # False once the keys outgrew `disk_bytes` (and were dropped)
        self.spilled_bytes = 0
        self._chunks: list[_Chunk] = []
        self._top_counts = np.zeros(256, np.int64)  # entries per top byte, all chunks
        self._pending: list[ScanIndex] = []
        self._pending_bytes = 0
        self._file: IO[bytes] | None = None

    def add(self, part: ScanIndex, *, keep: bool = True) -> None:
        np.bitwise_xor.at(self.tree.leaves, leaf_of(part.key_hashes, self.depth), part.entries)
        if not keep or not self.kept or not len(part):
            return
        self._pending.append(part)
        # Entries twice (as read and sorted), a length, the name.
        self._pending_bytes += 17 * len(part) + len(part.blob)
        if self._pending_bytes >= self.limits.memory_bytes * 2 // 3:
            self._seal(spill=True)

    def finish(self) -> None:
        """Every part added: the last, partial chunk stays in memory."""
        if self._pending:
            self._seal(spill=False)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _seal(self, *, spill: bool) -> None:
        parts, self._pending, self._pending_bytes = self._pending, [], 0
        entries = np.concatenate([p.entries for p in parts])
        ordered = np.sort(entries)
        bounds = np.searchsorted(
            ordered >> _TOP_SHIFT, np.arange(257, dtype=np.uint64), side="left"
        ).astype(np.int64)
        itemsize = np.dtype(_narrowest(np.array([p.lengths.max() for p in parts]))).itemsize
        lengths = [p.lengths.astype(f"u{itemsize}", copy=False) for p in parts]
        blob_size = sum(len(p.blob) for p in parts)
        chunk = _Chunk(len(entries), itemsize, blob_size)
        self._top_counts += np.diff(bounds)
        if not spill:
            chunk.bounds = bounds
            chunk.held = (
                entries,
                np.concatenate(lengths),
                b"".join(p.blob for p in parts),
                ordered,
            )
            self._chunks.append(chunk)
            return
        size = chunk.record_size + 8 * chunk.n + 8 * len(bounds)
        if self.spilled_bytes + size > self.limits.disk_bytes:
            self._give_up()
            return
        if self._file is None:
            # Unbuffered: chunks are read back with pread, past any buffer.
            self._file = tempfile.TemporaryFile(buffering=0, dir=self.limits.directory)  # noqa: SIM115
        chunk.at = self.spilled_bytes
        # Written as they are, not joined first: a chunk is held once, not twice.
        _write_all(self._file, [entries, *lengths, *(p.blob for p in parts), ordered, bounds])
        self.spilled_bytes += size
        self._chunks.append(chunk)

    def _give_up(self) -> None:
        """Past the disk limit: keep nothing (a walk then reads its leaves again)."""
        self.kept = False
        self._chunks, self._pending, self._pending_bytes = [], [], 0
        self._top_counts[:] = 0
        self.close()

    def _arrays(self, chunk: _Chunk) -> tuple[U64, npt.NDArray[Any], bytes]:
        if chunk.held is not None:
            return chunk.held[0], chunk.held[1], chunk.held[2]
        data = self._read(chunk.at, chunk.record_size)
        n, itemsize = chunk.n, chunk.itemsize
        entries = np.frombuffer(data, np.uint64, n)
        lengths = np.frombuffer(data, np.dtype(f"u{itemsize}"), n, 8 * n)
        return entries, lengths, data[n * (8 + itemsize) :]

    def _sorted_range(self, chunk: _Chunk, first: int, stop: int) -> U64:
        """The chunk's sorted entries whose top byte is in [first, stop)."""
        if chunk.held is not None:
            assert chunk.bounds is not None
            start, end = int(chunk.bounds[first]), int(chunk.bounds[stop])
            return chunk.held[3][start:end]
        bounds_at = chunk.at + chunk.record_size + 8 * chunk.n  # after the sorted entries
        start, end = (
            int(np.frombuffer(self._read(bounds_at + 8 * i, 8), np.int64)[0]) for i in (first, stop)
        )
        data = self._read(chunk.at + chunk.record_size + 8 * start, 8 * (end - start))
        return np.frombuffer(data, np.uint64)

    def _read(self, at: int, size: int) -> bytes:
        assert self._file is not None
        data = os.pread(self._file.fileno(), size, at)
        if len(data) != size:
            raise OSError(f"short read from a scan's spill file ({len(data)} of {size} bytes)")
        return data

    def count_duplicates_once(self) -> None:
        """A key SCAN returned twice (while the server resized its table) was XORed in
        twice, which cancels it: put it back. Same key, same state, same entry hash."""
        self.finish()
        if not self._chunks:
            return
        counts = self._top_counts
        # Entries sorted at a time: with their sorted copy and repeats, about the limit.
        per_group = max(1, self.limits.memory_bytes // 24)
        repeats: list[U64] = []
        first = 0
        while first < 256:
            stop, total = first + 1, int(counts[first])
            while stop < 256 and total + int(counts[stop]) <= per_group:
                total += int(counts[stop])
                stop += 1
            group = np.concatenate([self._sorted_range(c, first, stop) for c in self._chunks])
            group.sort()
            repeats.append(group[1:][group[1:] == group[:-1]])
            del group
            first = stop
        repeated = np.concatenate(repeats)
        if not len(repeated):
            return
        values, counts = np.unique(repeated, return_counts=True)  # counts = sightings - 1
        for value in values[counts % 2 == 1]:  # an even number of sightings cancelled out
            self._restore(value)

    def _restore(self, value: np.uint64) -> None:
        for chunk in self._chunks:
            entries, lengths, blob = self._arrays(chunk)
            at = np.flatnonzero(entries == value)
            if len(at):
                start = int(lengths[: at[0]].sum(dtype=np.int64))
                name = blob[start : start + int(lengths[at[0]])]
                leaf = int(leaf_of(hash_each([name]), self.depth)[0])
                self.tree.leaves[leaf] ^= value
                return

    def in_leaves(self, wanted: I64) -> ScanIndex:
        """The kept keys in the leaves `wanted`."""
        mask = np.zeros(len(self.tree.leaves), dtype=np.bool_)
        mask[wanted] = True
        return ScanIndex.concat(list(self.parts_in(mask)))

    def parts_in(self, mask: npt.NDArray[np.bool_]) -> Iterator[ScanIndex]:
        """The kept keys whose leaf is True in `mask` (a flag per leaf), a chunk at a
        time: one gather per chunk, no search."""
        self.finish()
        for chunk in self._chunks:
            entries, lengths, blob = self._arrays(chunk)
            hashes = hash_names(blob, lengths)
            picked = np.flatnonzero(mask[leaf_of(hashes, self.depth)])
            if not len(picked):
                continue
            ends = np.cumsum(lengths, dtype=np.int64)[picked]
            starts = ends - lengths[picked]
            names = [blob[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
            yield ScanIndex(
                hashes[picked],
                entries[picked],
                lengths[picked].astype(np.uint32),
                b"".join(names),
            )


def _write_all(file: IO[bytes], pieces: list[Any]) -> None:
    for piece in pieces:
        view = memoryview(piece).cast("B")
        while view:
            written = file.write(view)
            if written is None:  # pragma: no cover - a blocking file always writes
                continue
            view = view[written:]


def _narrowest(lengths: npt.NDArray[np.unsignedinteger[Any]]) -> type[np.unsignedinteger[Any]]:
    """The narrowest unsigned type that holds every length (key names are mostly short)."""
    longest = int(lengths.max()) if len(lengths) else 0
    if longest < 1 << 8:
        return np.uint8
    return np.uint16 if longest < 1 << 16 else np.uint32


# What a check's processes take whatever the keyspace (PSS, measured with 2 replicas:
# ~51 MB, of which the check's own process ~43 MB before it forks its scans).
FIXED_MB, FIXED_PER_SCAN_MB = 35, 8
# A scan process's peak grows by ~2.5x the keys it holds (the chunk being gathered,
# its sealing, the scan's own buffers), and the heap keeps some of what it freed: each
# is given a sixteenth of its share (2 replicas, 2M keys, check_memory_mb 64: a quarter,
# 1.6 MB each, peaked at 59-61 MiB; 0.4 MB at 55.5), at least `LEAST_HELD_BYTES`.
SHARE_HELD = 16
LEAST_HELD_BYTES = 512 << 10
# Past this a chunk held in memory buys nothing: it is read back from the page cache
# about as fast as from memory (2 replicas, default budget: ~71 MB at any keyspace).
MOST_HELD_BYTES = 4 << 20


def keep_limits(memory_mb: int, spill_mb: int, scans: int) -> KeepLimits:
    """Each of `scans` scan processes' share of a check's `memory_mb` and `spill_mb`."""
    scans = max(1, scans)
    spare = (memory_mb - FIXED_MB - FIXED_PER_SCAN_MB * scans) << 20
    held = min(MOST_HELD_BYTES, max(LEAST_HELD_BYTES, spare // scans // SHARE_HELD))
    return KeepLimits(memory_bytes=held, disk_bytes=(max(0, spill_mb) << 20) // scans)


# The keys of the differing leaves, a batch at a time (`walk.keys_in_batches`): the check
# process holds every member's part of a batch and its comparison (~2.5x the keys' size),
# a scan process the part it sends (~3x). A sixteenth of what the fixed sizes leave, within
# these bounds: at most 2 MB (~50,000 keys), so that what the check holds for them is
# the same at 1M keys as at 100M (~1,500 keys a leaf: ~90 batches for 1,000 differing
# leaves of 3 members, a round trip each).
LEAST_BATCH_BYTES, MOST_BATCH_BYTES = 256 << 10, 2 << 20


def batch_bytes(memory_mb: int, scans: int) -> int:
    """The keys of differing leaves a check of `scans` members holds at once (all
    members' parts of a batch together), within `memory_mb`."""
    spare = (memory_mb - FIXED_MB - FIXED_PER_SCAN_MB * max(1, scans)) << 20
    return min(MOST_BATCH_BYTES, max(LEAST_BATCH_BYTES, spare // 16))
