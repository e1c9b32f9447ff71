"""The agent's per-key table against a dict: any mix of writes and deletes, merged or not,
names read back from its file; keys whose hashes share a bucket and half their bits."""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path

import numpy as np
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from replag.agent.keytable import KeyTable
from replag.agent.tablebuild import TableBuilder
from replag.repair.scan.scanner import ScanIndex
from replag.repair.trees.tictac import TictacTree

DEPTH = 8  # few leaves, so leaves hold several keys
NAMES = [b"k%d" % i for i in range(40)] + [b"\xff\x00bin", b"", b"L" * 70_000]


def _hash(name: bytes) -> int:
    return int(xxhash.xxh3_64_intdigest(name))


def _index(model: dict[bytes, int]) -> ScanIndex:
    names = list(model)
    return ScanIndex(
        np.array([_hash(k) for k in names], np.uint64),
        np.array([model[k] for k in names], np.uint64),
        np.array([len(k) for k in names], np.uint32),
        b"".join(names),
    )


def _tree(model: dict[bytes, int], depth: int = DEPTH) -> TictacTree:
    return _index(model).tree(depth)


def _as_dict(index: ScanIndex) -> dict[bytes, int]:
    out = {index.key(i): int(index.entries[i]) for i in range(len(index))}
    assert len(out) == len(index)  # no key twice
    return out


def _apply(table: KeyTable, tree: TictacTree, batch: dict[bytes, int | None]) -> None:
    names = list(batch)
    hashes = np.array([_hash(k) for k in names], np.uint64)
    new = np.array([batch[k] or 0 for k in names], np.uint64)
    present = np.array([batch[k] is not None for k in names], bool)
    table.apply(hashes, new, present, names, tree=tree)


def _check(table: KeyTable, model: dict[bytes, int]) -> None:
    assert len(table) == len(model)
    assert _as_dict(table.keys_in_leaves(np.arange(1 << DEPTH), DEPTH)) == model
    some = np.arange(0, 1 << DEPTH, 3)
    wanted = set(some.tolist())
    expect = {k: v for k, v in model.items() if (_hash(k) >> (64 - DEPTH)) in wanted}
    assert _as_dict(table.keys_in_leaves(some, DEPTH)) == expect
    # Leaves narrower than the table's buckets (depth 20 > 16): the file is filtered.
    deep = sorted({_hash(k) >> 44 for k in list(model)[::2]} | {5})
    expect = {k: v for k, v in model.items() if (_hash(k) >> 44) in set(deep)}
    assert _as_dict(table.keys_in_leaves(deep, 20)) == expect


entries = st.integers(min_value=1, max_value=2**64 - 1)
batches = st.lists(
    st.dictionaries(st.sampled_from(NAMES), st.one_of(st.none(), entries), max_size=12),
    max_size=12,
)


@settings(max_examples=80, deadline=None)
@given(
    start=st.dictionaries(st.sampled_from(NAMES), entries, max_size=30),
    batches=batches,
    merge_every=st.integers(min_value=1, max_value=20),
    rewrite_floor=st.sampled_from([0, 3, 1000]),
)
def test_table_and_tree_follow_every_write_and_delete(
    start: dict[bytes, int],
    batches: list[dict[bytes, int | None]],
    merge_every: int,
    rewrite_floor: int,
) -> None:
    model = dict(start)
    table = KeyTable.from_index(_index(model), merge_every=merge_every)
    table.rewrite_floor = rewrite_floor
    tree = table.tree(DEPTH)
    for step, batch in enumerate(batches):
        _apply(table, tree, batch)
        if table.rewrite_due:  # as the live tree does, in turn in a thread or cooperatively
            if step % 2:
                table.rewrite_names()
            else:
                asyncio.run(table.rewrite_names_async())
        for name, entry in batch.items():
            if entry is None:
                model.pop(name, None)
            else:
                model[name] = entry
        assert len(table) == len(model)
        assert tree == _tree(model) == table.tree(DEPTH)
    _check(table, model)

    out = io.BytesIO()
    table.image().write(out)
    out.seek(0)
    restored = KeyTable.read_from(out, merge_every=merge_every)
    assert restored.tree(DEPTH) == tree
    _check(restored, model)
    table.rewrite_names()
    _check(table, model)
    table.close()
    restored.close()


def _pairs(shared: int, n: int = 400_000) -> list[tuple[bytes, bytes]]:
    """Names whose hashes agree on the bits in `shared` (a mask), and differ elsewhere."""
    names = [b"c:%d" % i for i in range(n)]
    hashes = np.fromiter((_hash(k) for k in names), np.uint64, count=n)
    masked = hashes & np.uint64(shared)
    order = np.argsort(masked, kind="stable")
    same = np.flatnonzero(masked[order][1:] == masked[order][:-1])
    pairs = [(names[order[i]], names[order[i + 1]]) for i in same.tolist()]
    assert pairs, "no pair found"
    return pairs[:5]


def test_keys_sharing_a_bucket_and_half_their_hash_stay_apart() -> None:
    """The bucket (top 16 bits) and the next 16 shared; or the bucket and the low 16
    shared: every key kept, updated and deleted on its own."""
    top32 = _pairs(0xFFFF_FFFF_0000_0000)
    bucket_and_low = _pairs(0xFFFF_0000_0000_FFFF)
    crowd = [b"crowd:%d" % i for i in range(3000)]  # many keys a bucket at depth 8
    model = {name: i + 1 for i, name in enumerate(crowd)}
    table = KeyTable.from_index(_index(model), merge_every=7)
    table.rewrite_floor = 2
    tree = table.tree(DEPTH)
    for a, b in top32 + bucket_and_low:
        _apply(table, tree, {a: 11, b: 12})
        model[a], model[b] = 11, 12
        if table.rewrite_due:
            table.rewrite_names()
    assert tree == _tree(model) == table.tree(DEPTH)
    _check(table, model)
    for a, b in top32 + bucket_and_low:  # one of each pair changes, the other goes
        _apply(table, tree, {a: 21, b: None})
        model[a] = 21
        del model[b]
        if table.rewrite_due:
            table.rewrite_names()
    assert tree == _tree(model) == table.tree(DEPTH)
    _check(table, model)
    for _, b in top32 + bucket_and_low:  # and back
        _apply(table, tree, {b: 31})
        model[b] = 31
    table.merge()
    assert tree == _tree(model) == table.tree(DEPTH)
    _check(table, model)
    table.close()


def test_the_names_file_has_no_name_in_its_directory(tmp_path: Path) -> None:
    where = tmp_path / "state"
    model = {b"key:%09d" % i: i + 1 for i in range(50_000)}
    table = KeyTable.from_index(_index(model), directory=where)
    assert os.listdir(where) == []  # unlinked: gone with the process, however it ends
    assert oct(where.stat().st_mode & 0o777) == "0o700"
    assert table.disk_bytes == sum(4 + len(k) for k in model)
    # In memory: 8 (entry) + 4 + 2 (the key hash's low 48 bits) a key, besides 1.5 MiB
    # of bucket indexes that do not grow with the keys.
    assert table.bytes_per_key() == 14
    table.close()


def test_hashes_that_differ_in_one_bit_are_different_keys() -> None:
    """The table's lookups, counts and tree by hash alone (hashes made up, so names
    are not read back): every bit of the 64 tells keys apart, wherever it is stored."""
    base = 0x1234_5678_9ABC_DEF0
    near = [base ^ (1 << bit) for bit in range(64)]
    table = KeyTable.from_index(
        ScanIndex(
            np.array([base], np.uint64),
            np.array([1], np.uint64),
            np.array([1], np.uint32),
            b"b",
        ),
        merge_every=5,
    )
    tree = table.tree(DEPTH)
    model = {base: 1}
    for step, h in enumerate(near):
        table.apply(
            np.array([h], np.uint64),
            np.array([100 + step], np.uint64),
            np.array([True]),
            [b"n%d" % step],
            tree=tree,
        )
        model[h] = 100 + step

    def model_tree() -> TictacTree:
        expect = TictacTree(DEPTH)
        expect.add(np.array(list(model), np.uint64), np.array(list(model.values()), np.uint64))
        return expect

    assert len(table) == 65 and tree == model_tree() == table.tree(DEPTH)
    hashes = np.array(list(model), np.uint64)
    found, held = table.lookup(hashes)
    assert held.all() and found.tolist() == list(model.values())
    for h in near[::2]:  # every other one deleted: the rest untouched
        table.apply(
            np.array([h], np.uint64), np.zeros(1, np.uint64), np.array([False]), [b""], tree=tree
        )
        del model[h]
    table.merge()
    assert len(table) == len(model) and tree == model_tree() == table.tree(DEPTH)
    found, held = table.lookup(np.array(near, np.uint64))
    assert held.tolist() == [h in model for h in near]
    table.close()


def test_a_table_built_batch_by_batch_equals_one_built_from_the_whole_scan(
    tmp_path: Path,
) -> None:
    """The scan's batches streamed into `TableBuilder` (names spilled, several flushes):
    the same keys, entries, names and tree as `from_index` of the deduplicated scan; a
    key the scan returned twice keeps its last sighting."""
    names = [b"s:%d" % i for i in range(30_000)] + [b"", b"\xff\x00", b"L" * 70_000]
    names += [b"long:%d:" % i + b"y" * (300 + i) for i in range(200)]
    batches = []
    rng = np.random.default_rng(5)
    for start in range(0, len(names), 700):
        chunk = names[start : start + 700]
        if start % 2100 == 0:  # a few keys seen again later with another entry
            chunk = chunk + names[: 3 + start // 2100]
        batches.append(
            ScanIndex(
                np.array([_hash(k) for k in chunk], np.uint64),
                rng.integers(1, 2**63, len(chunk), dtype=np.uint64),
                np.array([len(k) for k in chunk], np.uint32),
                b"".join(chunk),
            )
        )
    whole = ScanIndex.concat(batches).deduplicated()
    expect = KeyTable.from_index(whole)
    builder = TableBuilder(directory=tmp_path / "state", flush_bytes=50_000)  # many blocks
    for part in batches:
        builder.add(part)
    built = builder.finish()
    assert os.listdir(tmp_path / "state") == []
    assert len(built) == len(expect) == len(set(names))
    assert built.tree(DEPTH) == expect.tree(DEPTH) == whole.tree(DEPTH)
    every = np.arange(1 << DEPTH)
    assert _as_dict(built.keys_in_leaves(every, DEPTH)) == _as_dict(whole)
    assert _as_dict(built.keys_in_leaves(every, DEPTH)) == _as_dict(
        expect.keys_in_leaves(every, DEPTH)
    )
    built.close()
    expect.close()
