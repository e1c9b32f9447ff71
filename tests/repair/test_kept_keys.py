"""A scan process's kept keys (`KeptKeys`): compact, bounded in memory, and still exact.

Plain data, no server: the scans that fill it run against real servers in
test_scan_process.py and test_scan.py.
"""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import numpy as np
import pytest

from replag.repair.keyspace import native
from replag.repair.scan.keep import (
    LEAST_BATCH_BYTES,
    MOST_BATCH_BYTES,
    KeepLimits,
    KeptKeys,
    batch_bytes,
    keep_limits,
)
from replag.repair.scan.scanner import ScanIndex, index_batch
from replag.repair.scan.selection import LeafSelection
from replag.repair.trees.diff import in_leaves

DEPTH = 10


# Held in memory, or spilled a few hundred keys at a time (every path of the file).
HELD, SPILLED = KeepLimits(), KeepLimits(memory_bytes=8 << 10)


@pytest.fixture(params=["held", "spilled"])
def limits(request: pytest.FixtureRequest) -> KeepLimits:
    return HELD if request.param == "held" else SPILLED


@pytest.fixture(params=["native", "python"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native" and not native.NATIVE:
        pytest.skip("replag._scanindex was not built")
    if request.param == "python":
        monkeypatch.setattr(native, "_native", None)
    return str(request.param)


def _index(keys: list[bytes]) -> ScanIndex:
    values = [b"value of " + k for k in keys]
    return index_batch(keys, values, np.full(len(keys), -1, np.int64), 0, 1000)


def _batches(keys: list[bytes], size: int) -> list[ScanIndex]:
    return [_index(keys[i : i + size]) for i in range(0, len(keys), size)]


def test_a_key_scan_returned_twice_counts_once(implementation: str, limits: KeepLimits) -> None:
    keys = [b"key:%d" % i for i in range(3000)]
    # SCAN saw some keys twice and some three times, in other batches than the first.
    seen = [*keys, *keys[10:20], *keys[100:103], *keys[100:103]]
    random.Random(1).shuffle(seen)
    kept = KeptKeys(DEPTH, limits)
    for part in _batches(seen, 256):
        kept.add(part)
    kept.count_duplicates_once()
    assert np.array_equal(kept.tree.leaves, _index(keys).tree(DEPTH).leaves)
    assert (kept.spilled_bytes > 0) == (limits is SPILLED)
    kept.close()


def test_entries_alike_in_their_top_bits_are_not_repeats(implementation: str) -> None:
    kept = KeptKeys(DEPTH)
    part = _index([b"a", b"b"])
    # A decoy whose entry shares the top 32 bits of another's but is not the same.
    part.entries = np.array([part.entries[0], part.entries[0] ^ np.uint64(1)], np.uint64)
    kept.add(part)
    before = kept.tree.leaves.copy()
    kept.count_duplicates_once()
    assert np.array_equal(kept.tree.leaves, before)


@pytest.mark.parametrize("name_size", [5, 300, 70_000])  # lengths kept in 1, 2 and 4 bytes
def test_the_keys_of_some_leaves_are_exact(
    implementation: str, name_size: int, limits: KeepLimits
) -> None:
    keys = [b"%d:" % i + b"k" * name_size for i in range(200)]
    parts = _batches(keys, 64)
    kept = KeptKeys(4, limits)
    for part in parts:
        kept.add(part)
    wanted = np.array([0, 3, 7, 15], np.int64)
    got = kept.in_leaves(wanted)
    want = in_leaves(ScanIndex.concat(parts), wanted, 4)
    assert 0 < len(got) < len(keys)
    assert [got.key(i) for i in range(len(got))] == [want.key(i) for i in range(len(want))]
    assert got.key_hashes.tolist() == want.key_hashes.tolist()
    assert got.entries.tolist() == want.entries.tolist()
    assert got.lengths.dtype == np.uint32


def test_past_the_disk_limit_nothing_is_kept() -> None:
    keys = [b"key:%d" % i for i in range(3000)]
    kept = KeptKeys(DEPTH, KeepLimits(memory_bytes=8 << 10, disk_bytes=20 << 10))
    for part in _batches(keys, 256):
        kept.add(part)
    kept.count_duplicates_once()
    # The tree is whole; the keys are not (a walk reads its leaves again).
    assert np.array_equal(kept.tree.leaves, _index(keys).tree(DEPTH).leaves)
    assert not kept.kept and kept.spilled_bytes <= 20 << 10


def test_a_checks_memory_is_shared_by_its_scans() -> None:
    assert keep_limits(256, 16384, 2) == KeepLimits(4 << 20, 8192 << 20)
    small = keep_limits(80, 1000, 2)
    assert small.memory_bytes == (80 - 35 - 16 << 20) // 32 and small.disk_bytes == 500 << 20
    assert keep_limits(10, 0, 3) == KeepLimits(512 << 10, 0)


def test_the_spill_file_has_no_name_and_only_its_owner_reads_it(tmp_path: Path) -> None:
    kept = KeptKeys(DEPTH, KeepLimits(memory_bytes=8 << 10, directory=str(tmp_path)))
    for part in _batches([b"key:%d" % i for i in range(3000)], 256):
        kept.add(part)
    assert kept.spilled_bytes > 0 and kept._file is not None
    # Nothing in the directory: a killed scan leaves nothing behind.
    assert list(tmp_path.iterdir()) == []
    assert os.readlink(f"/proc/self/fd/{kept._file.fileno()}").endswith("(deleted)")
    assert stat.S_IMODE(os.fstat(kept._file.fileno()).st_mode) == 0o600
    kept.close()


@pytest.mark.parametrize("memory_bytes", [1 << 20, 2 << 10])  # held, or in the file
def test_the_keys_of_batches_of_leaves_come_from_one_pass(
    implementation: str, limits: KeepLimits, memory_bytes: int, tmp_path: Path
) -> None:
    keys = [b"key:%d" % i for i in range(5000)]
    seen = [*keys, *keys[:40]]  # SCAN returned some twice
    random.Random(2).shuffle(seen)
    kept = KeptKeys(DEPTH, limits)
    for part in _batches(seen, 256):
        kept.add(part)
    kept.count_duplicates_once()
    everything = _index(keys)
    batches = [np.arange(0, 100), np.array([101, 500, 900]), np.arange(1000, 1024)]
    selection = LeafSelection(batches, DEPTH, memory_bytes=memory_bytes, directory=str(tmp_path))
    for part in kept.parts_in(selection.wanted):
        selection.add(part)
    assert list(tmp_path.iterdir()) == []  # a file, if any, has no name
    assert (selection.spilled_bytes > 0) == (memory_bytes < 1 << 20)
    for i, leaves in enumerate(batches):
        got, want = selection.keys(i), in_leaves(everything, leaves, DEPTH)
        assert sorted(got.key(j) for j in range(len(got))) == sorted(
            want.key(j) for j in range(len(want))
        )
        assert sorted(got.entries.tolist()) == sorted(want.entries.tolist())
    selection.close()
    kept.close()


def test_a_batch_of_leaf_keys_is_a_sixteenth_of_what_the_fixed_sizes_leave() -> None:
    assert batch_bytes(256, 3) == MOST_BATCH_BYTES
    assert batch_bytes(64, 2) == (64 - 35 - 16 << 20) // 16
    assert batch_bytes(40, 2) == LEAST_BATCH_BYTES
