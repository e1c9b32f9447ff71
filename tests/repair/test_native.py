"""The C scan index (`replag._scanindex`) and its pure-Python twin agree bit for bit."""

from __future__ import annotations

import os
import random
import shlex
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import xxhash

from replag.repair.keyspace import native
from replag.repair.keyspace.digest import string_entry_hashes

needs_native = pytest.mark.skipif(not native.NATIVE, reason="replag._scanindex was not built")

# xxh3 takes a different path for 0, 1–3, 4–8, 9–16, 17–128, 129–240 and longer inputs.
SIZES = [0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 5000]


def _items(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for size in SIZES for _ in range(3)]


def test_the_install_built_the_c_module() -> None:
    # Where the install could compile it, a silently missing module (a broken build hook)
    # would make every check 3× slower per key: fail, not skip.
    if os.environ.get("REPLAG_NO_NATIVE"):
        pytest.skip("REPLAG_NO_NATIVE is set")
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if shutil.which(compiler) is None or not headers.exists():
        pytest.skip(f"no C compiler ({compiler}) or no {headers}: the pure-Python twin runs")
    assert native.NATIVE, (
        "replag._scanindex was not built: reinstall (pip install -e .); see hatch_build.py"
    )


@needs_native
def test_hash_each_is_xxh3_64_of_each_item() -> None:
    items = _items(1)
    expected = [xxhash.xxh3_64_intdigest(item) for item in items]
    assert native.hash_each(items).tolist() == expected
    assert native.hash_each_python(items).tolist() == expected


@needs_native
def test_string_index_matches_python() -> None:
    keys, values = _items(2), _items(3)
    got = native.string_index(keys, values)
    want = native.string_index_python(keys, values)
    for a, b in zip(got[:3], want[:3], strict=True):
        assert a.dtype == b.dtype
        assert a.tolist() == b.tolist()
    assert got[3] == want[3] == b"".join(keys)
    hashes = np.array([xxhash.xxh3_64_intdigest(k) for k in keys], dtype=np.uint64)
    digests = np.array([xxhash.xxh3_64_intdigest(v) for v in values], dtype=np.uint64)
    assert got[1].tolist() == string_entry_hashes(hashes, digests).tolist()


@needs_native
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_hash_names_reads_lengths_of_any_width(dtype: type) -> None:
    names = [n[:200] for n in _items(4)]
    lengths = np.array([len(n) for n in names], dtype=dtype)
    blob = b"".join(names)
    expected = [xxhash.xxh3_64_intdigest(n) for n in names]
    assert native.hash_names(blob, lengths).tolist() == expected
    assert native.hash_names_python(blob, lengths).tolist() == expected


@needs_native
def test_entries_with_top_picks_by_top_bits_in_order() -> None:
    rng = np.random.default_rng(5)
    arrays = [rng.integers(0, 2**64, size=n, dtype=np.uint64) for n in (0, 7, 1000, 333)]
    for bits, top in ((1, 0), (1, 1), (2, 3), (16, 12345)):
        got = native.entries_with_top(arrays, bits, top)
        assert got.tolist() == native.entries_with_top_python(arrays, bits, top).tolist()
        got.sort()  # writable: the caller sorts it in place
    total = sum(len(native.entries_with_top(arrays, 2, top)) for top in range(4))
    assert total == sum(len(a) for a in arrays)


@needs_native
def test_bad_input_is_a_clear_error_not_a_crash() -> None:
    from replag import _scanindex

    with pytest.raises(TypeError, match=r"items\[1\] must be bytes, not str"):
        _scanindex.hash_each([b"a", "b"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="keys must be a list of bytes"):
        _scanindex.string_index((b"a",), [b"b"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        _scanindex.string_index([b"a", b"b"], [b"v"])
    with pytest.raises(TypeError, match=r"values\[0\] must be bytes, not NoneType"):
        _scanindex.string_index([b"a"], [None])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="runs past the blob's end"):
        _scanindex.hash_names(b"abc", np.array([2, 2], np.uint8), 1)
    with pytest.raises(ValueError, match="cover 2 of the blob's 3 bytes"):
        _scanindex.hash_names(b"abc", np.array([2], np.uint8), 1)
    with pytest.raises(ValueError, match="itemsize must be"):
        _scanindex.hash_names(b"abc", np.array([3], np.uint8), 3)
    with pytest.raises(ValueError, match="bits must be"):
        _scanindex.entries_with_top([], 0, 0)
    with pytest.raises(ValueError, match="not of 8-byte integers"):
        _scanindex.entries_with_top([b"abc"], 1, 0)
