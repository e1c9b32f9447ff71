"""The walk over members' trees (no Redis): where it asks first, what it folds, and that
the leaves it hands on hold every key a brute-force comparison finds, and few others."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replag.repair.scan.scanner import ScanIndex
from replag.repair.trees.diff import brute_force_candidates, differing_keys, in_leaves
from replag.repair.trees.tictac import TictacTree, leaf_of
from replag.repair.trees.walk import (
    CONTENTS_BUDGET,
    I64,
    KEY_BYTES,
    U64,
    differing_leaves,
    first_down,
    fold,
    keys_in_batches,
    leaf_batches,
    nodes_below,
)

DEPTH = 16


class LocalTree:
    """A `MemberTree` over an index held here, recording the questions it was asked."""

    def __init__(self, name: str, index: ScanIndex) -> None:
        self.name = name
        self.index = index
        self.keys = len(index)
        self._levels = index.tree(DEPTH).levels()
        self.asked: list[tuple[int, int, int]] = []  # (level, nodes asked, down)
        self.leaves_asked = 0

    async def first_nodes(self, depth: int) -> tuple[int, U64]:
        down = first_down(self.keys, depth)
        self.asked.append((0, 1, down))
        return down, nodes_below(self._levels, 0, np.zeros(1, np.int64), down)

    async def descendants(self, level: int, nodes: I64, down: int) -> U64:
        self.asked.append((level, len(nodes), down))
        return nodes_below(self._levels, level, nodes, down)

    async def leaf_keys(self, leaves: I64) -> ScanIndex:
        self.leaves_asked = len(leaves)
        return in_leaves(self.index, leaves, DEPTH)

    async def select_leaves(self, batches: Sequence[I64]) -> None:
        self.batches = list(batches)

    async def batch_keys(self, batch: int) -> ScanIndex:
        return await self.leaf_keys(self.batches[batch])


HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
NIBBLES = np.arange(60, -4, -4, dtype=np.uint64)  # a hash's 16 hex digits, first to last


def _index(hashes: np.ndarray, entries: np.ndarray) -> ScanIndex:
    """Each key named b"k%016x" % its hash (17 bytes), the names made at once by numpy (a
    million keys formatted one by one took seconds)."""
    hashes = hashes.astype(np.uint64)
    names = np.empty((len(hashes), 17), np.uint8)
    names[:, 0] = ord("k")
    names[:, 1:] = HEX[((hashes[:, None] >> NIBBLES) & np.uint64(15)).astype(np.intp)]
    lengths = np.full(len(hashes), 17, np.uint32)
    return ScanIndex(hashes, entries.astype(np.uint64), lengths, names.tobytes())


def _members(keys: int, changed: int, extra: int, seed: int) -> list[ScanIndex]:
    """Three replicas of `keys` keys; the second has `changed` values changed, the third
    `extra` keys the others lack."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**63, keys + extra, dtype=np.int64).astype(np.uint64) << 1
    entries = rng.integers(0, 2**63, keys + extra, dtype=np.int64).astype(np.uint64)
    base = _index(hashes[:keys], entries[:keys])
    other = entries[:keys].copy()
    # New entries are new hashes (flipping one bit of each would cancel out in a leaf).
    picked = rng.choice(keys, changed, replace=False)
    other[picked] = rng.integers(0, 2**63, changed, dtype=np.int64).astype(np.uint64)
    return [base, _index(hashes[:keys], other), _index(hashes, entries)]


def _walk(indexes: list[ScanIndex]) -> tuple[list[LocalTree], I64, set[bytes]]:
    trees = [LocalTree(f"m{i}", ix) for i, ix in enumerate(indexes)]

    async def go() -> tuple[I64, set[bytes]]:
        leaves = await differing_leaves(trees, DEPTH)
        parts = [await t.leaf_keys(leaves) for t in trees]
        return leaves, set(differing_keys(parts))

    leaves, found = asyncio.run(go())
    return trees, leaves, found


def test_first_question_level_follows_the_key_count() -> None:
    assert first_down(1_000_000, 16) == 16  # ~15 keys a leaf: straight to the leaves
    assert first_down(20_000, 16) == 11
    assert first_down(3_007, 16) == 8
    assert first_down(0, 16) == first_down(10, 16) == 1
    assert first_down(10**9, 20) == 16  # never more than 65,536 nodes at once
    assert first_down(10**9, 12) == 12


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), up=st.integers(0, 6))
def test_folding_a_level_gives_the_level_above(seed: int, up: int) -> None:
    rng = np.random.default_rng(seed)
    tree = TictacTree(DEPTH)
    tree.add(
        rng.integers(0, 2**63, 5_000, dtype=np.int64).astype(np.uint64),
        rng.integers(0, 2**63, 5_000, dtype=np.int64).astype(np.uint64),
    )
    levels = tree.levels()
    assert np.array_equal(fold(levels[12], up), levels[12 - up])


@pytest.mark.parametrize(
    ("keys", "changed", "extra"),
    [(200_000, 300, 0), (20_000, 6, 0), (20_000, 0, 3), (3_000, 40, 2_000), (50_000, 0, 0)],
)
def test_the_walk_hands_on_the_leaves_of_every_divergent_key(
    keys: int, changed: int, extra: int
) -> None:
    indexes = _members(keys, changed, extra, seed=keys + changed + extra)
    trees, leaves, found = _walk(indexes)
    assert found == set(brute_force_candidates(indexes))
    assert len(found) == changed + extra
    assert (len(leaves) == 0) == (len(found) == 0)
    # Each member answered the first question at the level its own key count calls for
    # (members with different counts were compared at the shallowest), then was asked
    # only below differing nodes; the keys fetched fit the budget.
    assert [t.asked[0] for t in trees] == [(0, 1, first_down(t.keys, DEPTH)) for t in trees]
    fetched = len(leaves) * max(t.keys for t in trees) >> DEPTH
    assert fetched * KEY_BYTES <= CONTENTS_BUDGET


def test_with_many_keys_only_the_differing_leaves_are_fetched() -> None:
    indexes = _members(1_000_000, 1_000, 0, seed=7)
    trees, leaves, found = _walk(indexes)
    assert len(found) == 1_000
    # One question for the tree (its 65,536 leaves), then the keys of differing leaves.
    assert all(t.asked == [(0, 1, 16)] for t in trees)
    hashes = np.array([int(name[1:], 16) for name in found], np.uint64)
    assert set(leaves.tolist()) == set(leaf_of(hashes, DEPTH).tolist())


def test_the_keys_of_many_differing_leaves_come_in_batches_within_the_budget() -> None:
    indexes = _members(100_000, 3000, 300, seed=5)
    trees = [LocalTree(f"m{i}", ix) for i, ix in enumerate(indexes)]
    budget = 64 << 10

    async def go() -> tuple[int, set[bytes], int]:
        leaves = await differing_leaves(trees, DEPTH)
        found: set[bytes] = set()
        batches, most = 0, 0
        async for parts in keys_in_batches(trees, leaves, DEPTH, budget):
            batches += 1
            most = max(most, sum(len(p) for p in parts))
            found |= set(differing_keys(parts))
        return batches, found, most

    batches, found, most = asyncio.run(go())
    assert found == set(brute_force_candidates(indexes))
    assert batches > 10
    # Batches are cut by the mean keys per leaf: each within a quarter of the budget.
    assert most * KEY_BYTES <= 1.25 * budget


def test_leaf_batches_are_sorted_whole_and_at_least_a_leaf() -> None:
    leaves = np.array([9, 3, 7, 1, 5], np.int64)
    assert [b.tolist() for b in leaf_batches(leaves, 9.0, 2, 1600)] == [[1, 3], [5, 7], [9]]
    assert [b.tolist() for b in leaf_batches(leaves, 1e6, 3, 1)] == [[1], [3], [5], [7], [9]]
