"""Tictac trees (no Redis): the tree diff finds exactly what a brute-force comparison finds."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from replag.errors import RepairError
from replag.repair.scan.scanner import ScanIndex
from replag.repair.trees.diff import brute_force_candidates, candidate_keys
from replag.repair.trees.tictac import TictacTree, differing_leaves

keys = st.binary(min_size=0, max_size=12)
contents = st.dictionaries(keys, st.integers(0, 3), max_size=60)


def index_of(content: dict[bytes, int]) -> ScanIndex:
    """A replica's index: the entry is a hash of (key, value) like the scanner makes."""
    names = list(content)
    hashes = np.array([xxhash.xxh3_64_intdigest(k) for k in names], dtype=np.uint64)
    entries = np.array(
        [xxhash.xxh3_64_intdigest(k + b"\0%d" % content[k]) for k in names], dtype=np.uint64
    )
    lengths = np.array([len(k) for k in names], dtype=np.uint32)
    return ScanIndex(hashes, entries, lengths, b"".join(names))


@settings(max_examples=150, deadline=None)
@given(base=contents, replicas=st.lists(contents, min_size=1, max_size=3), depth=st.integers(1, 12))
def test_tree_diff_equals_brute_force(
    base: dict[bytes, int], replicas: list[dict[bytes, int]], depth: int
) -> None:
    # Replicas share a common base and differ by random overrides, like real divergence.
    indexes = [index_of(base)] + [index_of({**base, **extra}) for extra in replicas]
    trees = [ix.tree(depth) for ix in indexes]
    assert candidate_keys(indexes, trees) == brute_force_candidates(indexes)
    if len(brute_force_candidates(indexes)) == 0:
        assert len(differing_leaves(trees)) == 0
        assert len({t.root for t in trees}) == 1


@settings(max_examples=100, deadline=None)
@given(content=contents, seed=st.integers(0, 2**32 - 1), cut=st.integers(0, 60))
def test_order_and_segments_do_not_matter(content: dict[bytes, int], seed: int, cut: int) -> None:
    index = index_of(content)
    whole = index.tree(10)
    order = np.random.default_rng(seed).permutation(len(index))
    shuffled = TictacTree(10)
    shuffled.add(index.key_hashes[order], index.entries[order])
    first, second = TictacTree(10), TictacTree(10)
    first.add(index.key_hashes[order[:cut]], index.entries[order[:cut]])
    second.add(index.key_hashes[order[cut:]], index.entries[order[cut:]])
    assert shuffled == whole
    assert first.merge(second) == whole
    assert TictacTree.from_bytes(whole.to_bytes()) == whole


def test_scan_duplicates_are_removed_before_the_tree() -> None:
    # SCAN may return a key twice; XOR would cancel it, so the index keeps one sighting.
    index = index_of({b"a": 1, b"b": 2})
    doubled = ScanIndex.concat([index, index_of({b"a": 1})])
    assert doubled.deduplicated().tree(8) == index.tree(8)
    assert doubled.tree(8) != index.tree(8)


def test_a_corrupt_tree_is_refused() -> None:
    data = TictacTree(4).to_bytes()
    with pytest.raises(RepairError):
        TictacTree.from_bytes(data[:-8])
    with pytest.raises(RepairError):
        TictacTree.from_bytes(b"XXXX" + data[4:])


def test_index_checkpoint_round_trip() -> None:
    index = index_of({b"\xff\x00binary": 1, b"k": 2, b"": 3})
    again = ScanIndex.from_bytes(index.to_bytes())
    assert [again.key(i) for i in range(len(again))] == [index.key(i) for i in range(len(index))]
    assert again.tree(6) == index.tree(6)


def test_unordered_digests_ignore_page_order_and_splits_but_not_content() -> None:
    from replag.repair.keyspace.digest import UnorderedDigest

    fields = [(b"f%d" % i, b"v%d" % i) for i in range(1000)]

    def digest(pages: list[list[tuple[bytes, bytes]]]) -> int:
        acc = UnorderedDigest(b"hash")
        for page in pages:
            acc.add_hash_page([f for f, _ in page], [v for _, v in page])
        return acc.digest()

    whole = digest([fields])
    assert digest([fields[600:], fields[:250], fields[250:600]]) == whole
    assert digest([list(reversed(fields))]) == whole
    changed = [*fields[:-1], (b"f999", b"other")]
    assert digest([changed]) != whole
    swapped = [*fields[:-2], (b"f998", b"v999"), (b"f999", b"v998")]
    assert digest([swapped]) != whole


def test_a_collection_read_with_an_element_seen_twice_counts_as_changed() -> None:
    from replag.repair.keyspace.values import _Reader

    reader = _Reader(b"h", "hash", 2, keep=False)
    reader.feed([3, [b"7", [b"a", b"1", b"b", b"2"]]])  # HLEN 3, first page
    reader.feed([[b"0", [b"b", b"2", b"c", b"3"]]])  # "b" again: the table was resized
    assert reader.done and reader.result() is None
    reader = _Reader(b"h", "hash", 2, keep=False)
    reader.feed([3, [b"7", [b"a", b"1", b"b", b"2"]]])
    reader.feed([[b"0", [b"c", b"3"]]])
    assert reader.result() is not None
