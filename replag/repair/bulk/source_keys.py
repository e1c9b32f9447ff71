"""The hashes of every key a rebuild's source scan returned, in bounded memory.

The closing pass asks two things of them: whether the scan returned a key twice
(`repeats`), and which keys another peer holds that the source's scan did not
return (`lacks`). 8 bytes a key: at 100M keys, 800 MB. They are held in memory up to
half of `memory_bytes` (a share of `check_memory_mb`, as a check's kept keys are: the
sort of a run joins the parts held, so the share is held twice for a moment); past it
the held part is sorted in place and written as one run to a private temporary file (no name,
mode 0600, gone when closed or when the process ends), read back through a read-only
memory map. `lacks` searches each run; `repeats` joins one value of the hashes' top
byte at a time across runs (each ~1/256 of the keys) and sorts only that.
"""

from __future__ import annotations

import os
import tempfile
from typing import IO

import numpy as np
import numpy.typing as npt

from replag.repair.keyspace.native import hash_each

U64 = npt.NDArray[np.uint64]
# Where each value of the top byte starts, in a sorted run: 1..255 << 56.
_TOP_EDGES = np.arange(1, 256, dtype=np.uint64) << np.uint64(56)
LEAST_BYTES = 64 << 10


def _holds(ordered: U64, hashes: U64) -> npt.NDArray[np.bool_]:
    if not len(ordered):
        return np.zeros(len(hashes), np.bool_)
    at = np.searchsorted(ordered, hashes)
    at[at >= len(ordered)] = 0
    found: npt.NDArray[np.bool_] = ordered[at] == hashes
    return found


def _repeated(ordered: U64) -> bool:
    """Whether sorted `ordered` holds a value twice (a bool a hash, not np.diff's 8 bytes)."""
    return bool(len(ordered) > 1 and np.any(ordered[1:] == ordered[:-1]))


class SourceKeys:
    """The hashes of every key the source's scan returned (see the module docstring)."""

    def __init__(self, *, memory_bytes: int = 64 << 20, directory: str | None = None) -> None:
        self.memory_bytes = max(LEAST_BYTES, memory_bytes)
        self.directory = directory
        self._parts: list[U64] = []
        self._held = 0  # bytes in `_parts`
        self._sorted: U64 | None = None
        self._count = 0
        self._file: IO[bytes] | None = None
        self._runs: list[tuple[int, int]] = []  # (offset, hashes) of each spilled run

    def __len__(self) -> int:
        return self._count

    @property
    def spilled_bytes(self) -> int:
        return 8 * sum(n for _, n in self._runs)

    def add(self, keys: list[bytes]) -> None:
        if not keys:
            return
        self._parts.append(hash_each(keys).copy())
        self._held += 8 * len(keys)
        self._count += len(keys)
        self._sorted = None
        if 2 * self._held >= self.memory_bytes:  # the run's sort joins the parts: twice
            self._spill()

    def _spill(self) -> None:
        run = self._ordered()
        if self._file is None:
            self._file = tempfile.TemporaryFile(dir=self.directory)  # noqa: SIM115 (closed by close)
        offset = self._file.seek(0, os.SEEK_END)
        self._file.write(run.data)  # no copy: the run's own buffer
        self._file.flush()
        self._runs.append((offset, len(run)))
        self._parts, self._held, self._sorted = [], 0, None

    def _ordered(self) -> U64:
        """The part held in memory, sorted."""
        if self._sorted is None:
            joined = np.concatenate(self._parts) if self._parts else np.zeros(0, np.uint64)
            self._parts = []  # the parts go before the sort: the share held once, not twice
            joined.sort()  # in place (np.unique hashes: 4x slower; repeats are fine)
            self._sorted = joined
            self._parts = [joined]
        return self._sorted

    def _run(self, i: int) -> U64:
        assert self._file is not None
        offset, count = self._runs[i]
        return np.memmap(self._file, dtype=np.uint64, mode="r", offset=offset, shape=(count,))

    def _sources(self) -> list[U64]:
        return [*(self._run(i) for i in range(len(self._runs))), self._ordered()]

    def repeats(self) -> bool:
        """Whether the scan returned some key twice (SCAN may, while the table grows)."""
        if not self._runs:
            return _repeated(self._ordered())
        sources = self._sources()
        bounds = [np.concatenate([[0], np.searchsorted(s, _TOP_EDGES), [len(s)]]) for s in sources]
        for top in range(256):
            joined = np.sort(
                np.concatenate(
                    [s[b[top] : b[top + 1]] for s, b in zip(sources, bounds, strict=True)]
                )
            )
            if _repeated(joined):
                return True
        return False

    def lacks(self, keys: list[bytes]) -> list[bytes]:
        """Those of `keys` the source's scan did not return."""
        if not keys:
            return []
        hashes = hash_each(keys)
        found = np.zeros(len(keys), np.bool_)
        for source in self._sources():
            found |= _holds(source, hashes)
        return [k for k, seen in zip(keys, found, strict=True) if not seen]

    def close(self) -> None:
        """Drop the spill file (its space goes back to the file system)."""
        if self._file is not None:
            self._file.close()
            self._file = None
