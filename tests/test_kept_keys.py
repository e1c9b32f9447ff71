"""A scan process's kept keys (`_KeptKeys`): compact, and still exact.

Plain data, no server: the scans that fill it run against real servers in
test_scan_process.py and test_repair_scan.py.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from replag.repair import native
from replag.repair.diff import in_leaves
from replag.repair.scan import ScanIndex, index_batch
from replag.repair.scan_process import _KeptKeys

DEPTH = 10


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


def test_a_key_scan_returned_twice_counts_once(implementation: str) -> None:
    keys = [b"key:%d" % i for i in range(3000)]
    # SCAN saw some keys twice and some three times, in other batches than the first.
    seen = [*keys, *keys[10:20], *keys[100:103], *keys[100:103]]
    random.Random(1).shuffle(seen)
    kept = _KeptKeys(DEPTH)
    for part in _batches(seen, 256):
        kept.add(part)
    kept.count_duplicates_once()
    assert np.array_equal(kept.tree.leaves, _index(keys).tree(DEPTH).leaves)


def test_entries_alike_in_their_top_bits_are_not_repeats(implementation: str) -> None:
    kept = _KeptKeys(DEPTH)
    part = _index([b"a", b"b"])
    # A decoy whose entry shares the top 32 bits of another's but is not the same.
    part.entries = np.array([part.entries[0], part.entries[0] ^ np.uint64(1)], np.uint64)
    kept.add(part)
    before = kept.tree.leaves.copy()
    kept.count_duplicates_once()
    assert np.array_equal(kept.tree.leaves, before)


@pytest.mark.parametrize("name_size", [5, 300, 70_000])  # lengths kept in 1, 2 and 4 bytes
def test_the_keys_of_some_leaves_are_exact(implementation: str, name_size: int) -> None:
    keys = [b"%d:" % i + b"k" * name_size for i in range(200)]
    parts = _batches(keys, 64)
    kept = _KeptKeys(4)
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
