"""The names of the keys an agent tracks, on disk, grouped by bucket of their key hash.

The agent needs a key's name only to answer "which keys are in leaf i"; the
tree itself needs only hashes. So the names live in a file, read only for the
buckets a check asks for:

* an unlinked temporary file (O_TMPFILE where the kernel has it): no name in
  any directory, 0600, in the agent's 0700 state directory; gone when the
  process ends, however it ends (kill -9 included), never to be cleaned up;
* a base, written in one pass (by a build, a load or a rewrite): the names'
  lengths (4 bytes each) then the names, grouped by bucket (the top
  `BUCKET_BITS` bits of the key hash), found through two in-memory indexes of
  where each bucket's records and names start (2 x 8 bytes x 2**16: 1 MiB, the
  same at any key count);
* a log of the names of keys added since, appended, with per name its hash,
  offset and length in memory (20 bytes a name) until the next rewrite.

The file never drops a name: the names of deleted keys stay until the owner
(`KeyTable`) rewrites the file with its live keys only, which it does once the
log and the dead names pass an eighth of the keys; disk is thus at most the
live names plus an eighth (4 bytes a name besides its bytes).
"""

from __future__ import annotations

import os
import tempfile
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

from replag.private_files import private_dir

BUCKET_BITS = 16
BUCKETS = 1 << BUCKET_BITS
_SHIFT = np.uint64(64 - BUCKET_BITS)
_COPY = 1 << 20  # bytes per read when copying a file
# Records per chunk when a base is rewritten: bounds the transient arrays (about 8 bytes
# per name byte while names are gathered) whatever the key count.
CHUNK_RECORDS = 1 << 18

U64 = npt.NDArray[np.uint64]
Lengths = npt.NDArray[np.uint32]
# One piece of a base, in bucket order: each name's bucket, length, and the names joined.
Piece = tuple[npt.NDArray[np.int64], Lengths, bytes]


def bucket_of(hashes: U64) -> npt.NDArray[np.int64]:
    return (hashes >> _SHIFT).astype(np.int64)


def gather(lengths: Lengths, blob: bytes, picks: npt.NDArray[np.int64]) -> tuple[Lengths, bytes]:
    """The names at `picks` (indexes into names laid end to end with `lengths`), joined."""
    picked = lengths[picks].astype(np.int64)
    if not len(picks) or not picked.sum():
        return picked.astype(np.uint32), b""
    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)[:-1]])[picks]
    out_starts = np.concatenate([[0], np.cumsum(picked)[:-1]])
    # An index per byte: int32 where the names allow (half the transient memory).
    kind = np.int32 if len(blob) < 2**31 else np.int64
    index = np.repeat((starts - out_starts).astype(kind), picked)
    index += np.arange(int(picked.sum()), dtype=kind)
    return picked.astype(np.uint32), np.frombuffer(blob, np.uint8)[index].tobytes()


def _pread(fd: int, size: int, offset: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        got = os.pread(fd, size - len(out), offset + len(out))
        if not got:
            raise OSError(f"names file ends at {offset + len(out)}, {size} bytes wanted")
        out += got
    return bytes(out)


def _pwrite(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


class NameFile:
    """Names by bucket of their key hash, in an unlinked file; see the module docstring."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        if directory is not None:
            private_dir(directory)
        # Kept open as long as the table lives; `close` ends it.
        self._file: IO[bytes] = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115
        self.fd = self._file.fileno()
        self.count = 0  # names in the base
        self.records = np.zeros(BUCKETS + 1, np.int64)  # base: each bucket's first record
        self.offsets = np.zeros(BUCKETS + 1, np.int64)  # base: each bucket's first name byte
        self.end = 0  # where the next log name goes
        self.log_hashes = array("Q")
        self.log_offsets = array("Q")
        self.log_lengths = array("I")

    @classmethod
    def build(cls, directory: Path | None, count: int, pieces: Iterable[Piece]) -> NameFile:
        """A file whose base is `count` names given in bucket order, piece by piece."""
        writer = NameFileWriter(directory, count)
        for piece in pieces:
            writer.add(piece)
        return writer.finish()

    def close(self) -> None:
        self._file.close()

    # --- reading --------------------------------------------------------------

    @property
    def base_bytes(self) -> int:
        return int(self.offsets[-1])

    @property
    def logged(self) -> int:
        return len(self.log_hashes)

    @property
    def disk_bytes(self) -> int:
        return self.end

    @property
    def nbytes(self) -> int:
        """Memory held: the two bucket indexes and the log's per-name arrays."""
        log = self.log_hashes, self.log_offsets, self.log_lengths
        return self.records.nbytes + self.offsets.nbytes + sum(a.itemsize * len(a) for a in log)

    def read(self, spans: Sequence[tuple[int, int]]) -> tuple[Lengths, bytes]:
        """Every name filed under the bucket ranges [first, stop) of `spans`: base and log,
        duplicates and the names of deleted keys included (the caller keeps its live keys)."""
        lengths: list[Lengths] = []
        blobs: list[bytes] = []
        for first, stop in spans:
            r0, r1 = int(self.records[first]), int(self.records[stop])
            raw = _pread(self.fd, 4 * (r1 - r0), 4 * r0)
            lengths.append(np.frombuffer(raw, "<u4").astype(np.uint32))
            o0, o1 = int(self.offsets[first]), int(self.offsets[stop])
            blobs.append(_pread(self.fd, o1 - o0, o0))
        if self.log_hashes:
            wanted = np.zeros(BUCKETS, bool)
            for first, stop in spans:
                wanted[first:stop] = True
            buckets = bucket_of(np.frombuffer(self.log_hashes, np.uint64))
            picked = np.flatnonzero(wanted[buckets]).tolist()
            if picked:
                extra = [_pread(self.fd, self.log_lengths[i], self.log_offsets[i]) for i in picked]
                lengths.append(np.fromiter(map(len, extra), np.uint32, count=len(extra)))
                blobs.extend(extra)
        if not lengths:
            return np.zeros(0, np.uint32), b""
        return np.concatenate(lengths), b"".join(blobs)

    def spans(self, first: int, stop: int) -> Iterator[tuple[int, int]]:
        """[first, stop) cut into bucket ranges of about `CHUNK_RECORDS` base names each."""
        at = first
        while at < stop:
            limit = self.records[at] + CHUNK_RECORDS
            end = int(np.searchsorted(self.records, limit, side="right")) - 1
            end = min(max(end, at + 1), stop)
            yield at, end
            at = end

    def batches(self, ranges: Iterable[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
        """Bucket ranges grouped so that each group holds about `CHUNK_RECORDS` base names
        (a range larger than that cut): one `read` and one pass over the names each."""
        batch: list[tuple[int, int]] = []
        size = 0
        for first, stop in ranges:
            for a, b in self.spans(first, stop):
                n = int(self.records[b] - self.records[a])
                if batch and size + n > CHUNK_RECORDS:
                    yield batch
                    batch, size = [], 0
                batch.append((a, b))
                size += n
        if batch:
            yield batch

    # --- changing -------------------------------------------------------------

    def append(self, key_hash: int, name: bytes) -> None:
        """File the name of a key added since the base was written."""
        _pwrite(self.fd, name, self.end)
        self.log_hashes.append(key_hash)
        self.log_offsets.append(self.end)
        self.log_lengths.append(len(name))
        self.end += len(name)

    # --- copying --------------------------------------------------------------

    def base_to(self, out: IO[bytes], fd: int | None = None) -> None:
        """Write the base (lengths, then names) to `out`, reading from `fd` (default: ours;
        a saver in another thread passes a dup of it, see `KeyTable.image`)."""
        fd = self.fd if fd is None else fd
        at, end = 0, self.base_bytes
        while at < end:
            chunk = _pread(fd, min(_COPY, end - at), at)
            out.write(chunk)
            at += len(chunk)

    @classmethod
    def base_from(
        cls,
        directory: Path | None,
        source: IO[bytes],
        count: int,
        records: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
    ) -> NameFile:
        """A file whose base is read from `source` (as `base_to` wrote it)."""
        names = cls(directory)
        end = int(offsets[-1])
        if int(records[-1]) != count or int(offsets[0]) != 4 * count or end < 4 * count:
            raise ValueError("names file: bucket index does not match the name count")
        at = 0
        while at < end:
            chunk = source.read(min(_COPY, end - at))
            if not chunk:
                raise ValueError("names file: truncated")
            _pwrite(names.fd, chunk, at)
            at += len(chunk)
        names.count = count
        names.records = records
        names.offsets = offsets
        names.end = end
        return names


class NameFileWriter:
    """Writes a `NameFile`'s base piece by piece (a caller may yield between pieces)."""

    def __init__(self, directory: Path | None, count: int) -> None:
        self.names = NameFile(directory)
        self.count = count
        self.names_at = 4 * count
        self.written = 0
        self.at = self.names_at
        self.per_bucket = np.zeros(BUCKETS, np.int64)
        self.bytes_per_bucket = np.zeros(BUCKETS, np.int64)
        self.last = 0

    def add(self, piece: Piece) -> None:
        buckets, lengths, blob = piece
        n = len(lengths)
        if n and (int(buckets[0]) < self.last or bool((np.diff(buckets) < 0).any())):
            raise ValueError("names file: names not in bucket order")
        self.last = int(buckets[-1]) if n else self.last
        if self.written + n > self.count:
            raise ValueError(f"names file: more than the {self.count} names announced")
        _pwrite(self.names.fd, lengths.astype("<u4").tobytes(), 4 * self.written)
        _pwrite(self.names.fd, blob, self.at)
        self.per_bucket += np.bincount(buckets, minlength=BUCKETS)
        np.add.at(self.bytes_per_bucket, buckets, lengths.astype(np.int64))
        self.written += n
        self.at += len(blob)

    def finish(self) -> NameFile:
        names = self.names
        if self.written != self.count:
            names.close()
            raise ValueError(f"names file: {self.written} names, {self.count} announced")
        names.count = self.count
        names.records[1:] = np.cumsum(self.per_bucket)
        names.offsets[0] = self.names_at
        names.offsets[1:] = self.names_at + np.cumsum(self.bytes_per_bucket)
        names.end = self.at
        return names

    def abandon(self) -> None:
        self.names.close()
