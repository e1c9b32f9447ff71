"""The agent's per-key table against a dict: any mix of writes and deletes, merged or not."""

from __future__ import annotations

import numpy as np
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from replag.agent.keytable import KeyTable
from replag.repair.scan.scanner import ScanIndex
from replag.repair.trees.tictac import TictacTree

DEPTH = 8  # few leaves, so leaves hold several keys
NAMES = [b"k%d" % i for i in range(40)] + [b"\xff\x00bin", b"L" * 70_000]


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


def _tree(model: dict[bytes, int]) -> TictacTree:
    return _index(model).tree(DEPTH)


entries = st.integers(min_value=1, max_value=2**64 - 1)
batches = st.lists(
    st.dictionaries(st.sampled_from(NAMES), st.one_of(st.none(), entries), max_size=12),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(
    start=st.dictionaries(st.sampled_from(NAMES), entries, max_size=30),
    batches=batches,
    merge_every=st.integers(min_value=1, max_value=20),
)
def test_table_and_tree_follow_every_write_and_delete(
    start: dict[bytes, int], batches: list[dict[bytes, int | None]], merge_every: int
) -> None:
    model = dict(start)
    table = KeyTable.from_index(_index(model), merge_every=merge_every)
    tree = table.tree(DEPTH)
    for batch in batches:
        names = list(batch)
        hashes = np.array([_hash(k) for k in names], np.uint64)
        new = np.array([batch[k] or 0 for k in names], np.uint64)
        present = np.array([batch[k] is not None for k in names], bool)
        table.apply(hashes, new, present, names, tree=tree)
        for name, entry in batch.items():
            if entry is None:
                model.pop(name, None)
            else:
                model[name] = entry
        assert len(table) == len(model)
        assert tree == _tree(model) == table.tree(DEPTH)

    every_leaf = table.keys_in_leaves(np.arange(1 << DEPTH), DEPTH)
    assert {every_leaf.key(i): int(every_leaf.entries[i]) for i in range(len(every_leaf))} == model
    some = np.arange(0, 1 << DEPTH, 3)
    part = table.keys_in_leaves(some, DEPTH)
    assert {part.key(i) for i in range(len(part))} == {
        k for k in model if (_hash(k) >> (64 - DEPTH)) in set(some.tolist())
    }

    restored = KeyTable.from_bytes(table.to_bytes())
    assert len(restored) == len(model) and restored.tree(DEPTH) == tree
    restored._rewrite_arena()
    again = restored.keys_in_leaves(np.arange(1 << DEPTH), DEPTH)
    assert {again.key(i): int(again.entries[i]) for i in range(len(again))} == model


def test_memory_per_key_is_about_22_bytes_plus_the_name() -> None:
    model = {b"key:%09d" % i: i + 1 for i in range(100_000)}
    table = KeyTable.from_index(_index(model))
    # 8 (hash) + 8 (entry) + 4 (name offset) + 2 (name length) + 13 (name)
    assert 35 <= table.bytes_per_key() <= 36
