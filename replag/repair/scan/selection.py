"""The keys of a walk's differing leaves, gathered in one pass and served in batches.

At 100M keys a leaf of the 2^16-leaf tree holds ~1,500 keys: the keys of a
thousand differing leaves are ~60 MB per member, more than a check's budget
allows its process to receive at once. The walk asks for them in batches of
leaves (`walk.leaf_batches`), each batch's keys bounded by the budget; a scan
process answers every batch from one pass over its kept keys (or one rescan of
its replica), not one pass per batch, by sorting what that pass finds into the
batches as it goes.

What the pass found is held in memory up to `memory_bytes`, then in a nameless
temporary file (as `keep.KeptKeys` spills: O_TMPFILE, mode 0600, gone once the
process ends, a kill included); a batch is read back with one `pread` per piece.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import IO

import numpy as np
import numpy.typing as npt

from replag.repair.trees.index import ScanIndex
from replag.repair.trees.tictac import leaf_of

I64 = npt.NDArray[np.int64]


class LeafSelection:
    """Keys sorted into the walk's batches of leaves (`batches[i]`: batch i's leaves)."""

    def __init__(
        self,
        batches: Sequence[I64],
        depth: int,
        *,
        memory_bytes: int,
        directory: str | None = None,
    ) -> None:
        self.depth = depth
        self.memory_bytes = memory_bytes
        self.directory = directory
        # Per leaf, the batch it belongs to (-1: a leaf no batch asks for).
        self._batch_of = np.full(1 << depth, -1, np.int32)
        for i, leaves in enumerate(batches):
            self._batch_of[leaves] = i
        self.batches = len(batches)
        # Per batch, its pieces: bytes held, or (offset, size) in the file.
        self._pieces: list[list[bytes | tuple[int, int]]] = [[] for _ in batches]
        self._held = 0
        self._file: IO[bytes] | None = None
        self._written = 0

    @property
    def wanted(self) -> npt.NDArray[np.bool_]:
        """A flag per leaf: whether a batch asks for it."""
        flags: npt.NDArray[np.bool_] = self._batch_of >= 0
        return flags

    def add(self, part: ScanIndex) -> None:
        """Sort `part`'s keys of the selected leaves into their batches."""
        if not len(part):
            return
        batch = self._batch_of[leaf_of(part.key_hashes, self.depth)]
        picked = np.flatnonzero(batch >= 0)
        if not len(picked):
            return
        picked = picked[np.argsort(batch[picked], kind="stable")]
        counts = np.bincount(batch[picked], minlength=self.batches)
        ends = np.cumsum(counts)
        offsets = np.concatenate([[0], np.cumsum(part.lengths, dtype=np.int64)])
        for i in np.flatnonzero(counts).tolist():
            rows = picked[ends[i] - counts[i] : ends[i]]
            names = b"".join(part.blob[offsets[r] : offsets[r + 1]] for r in rows.tolist())
            piece = ScanIndex(
                part.key_hashes[rows], part.entries[rows], part.lengths[rows], names
            ).to_bytes()
            self._keep(i, piece)

    def _keep(self, batch: int, piece: bytes) -> None:
        if self._file is None and self._held + len(piece) <= self.memory_bytes:
            self._pieces[batch].append(piece)
            self._held += len(piece)
            return
        if self._file is None:
            # Past what may be held: everything held so far goes to the file too.
            self._file = tempfile.TemporaryFile(buffering=0, dir=self.directory)  # noqa: SIM115
            for pieces in self._pieces:
                for j, held in enumerate(pieces):
                    assert isinstance(held, bytes)
                    pieces[j] = self._write(held)
            self._held = 0
        self._pieces[batch].append(self._write(piece))

    def _write(self, piece: bytes) -> tuple[int, int]:
        assert self._file is not None
        at, view = self._written, memoryview(piece)
        while view:
            written = self._file.write(view)
            view = view[written or 0 :]
        self._written += len(piece)
        return at, len(piece)

    def keys(self, batch: int) -> ScanIndex:
        """Batch `batch`'s keys, each once (SCAN may have returned a key twice)."""
        parts = [ScanIndex.from_bytes(self._read(piece)) for piece in self._pieces[batch]]
        return ScanIndex.concat(parts).deduplicated()

    def _read(self, piece: bytes | tuple[int, int]) -> bytes:
        if isinstance(piece, bytes):
            return piece
        assert self._file is not None
        at, size = piece
        data = os.pread(self._file.fileno(), size, at)
        if len(data) != size:
            raise OSError(f"short read from a scan's selection file ({len(data)} of {size})")
        return data

    @property
    def spilled_bytes(self) -> int:
        return self._written

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
