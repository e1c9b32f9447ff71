"""The lag-window tables (merge, prune, compaction), on SQLite and on PostgreSQL."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from replag.histogram import LagHistogram
from replag.store import LagWindow, Store, summarize


def _window(i: int, values: list[int]) -> LagWindow:
    w = LagWindow(
        run_id=f"r{i}",
        source="a",
        target="b",
        replica="b-1",
        start_ns=i * 1000,
        end_ns=i * 1000 + 999,
        sent=len(values) + 1,
        seen=len(values),
        lost=1,
    )
    for v in values:
        w.lag.record_us(v)
        w.uncertainty.record_us(v / 100)
    return w


def test_merged_windows_give_the_percentiles_of_one_histogram(store: Store) -> None:
    rng = random.Random(7)
    chunks = [
        [int(rng.lognormvariate(10, 1)) for _ in range(rng.randint(1, 400))] for _ in range(30)
    ]
    store.append_windows([_window(i, c) for i, c in enumerate(chunks)])
    big = LagHistogram()
    for c in chunks:
        for v in c:
            big.record_us(v)
    merged = summarize(store.windows(source="a", target="b"), source="a", target="b", replica=None)
    assert merged.lag_ms == big.summary_ms()
    assert merged.seen == sum(map(len, chunks)) and merged.lost == 30
    part = store.windows(source="a", target="b", since_ns=10_000, until_ns=20_000)
    assert [w.run_id for w in part] == [f"r{i}" for i in range(10, 20)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 10**9), max_size=50), min_size=1, max_size=8))
def test_merge_is_exact_for_any_split(chunks: list[list[int]]) -> None:
    parts = []
    for c in chunks:
        h = LagHistogram()
        for v in c:
            h.record_us(v)
        parts.append(LagHistogram.decode(h.encode(), h.out_of_range))
    merged, big = LagHistogram(), LagHistogram()
    for p in parts:
        merged.merge(p)
    for c in chunks:
        for v in c:
            big.record_us(v)
    assert merged.summary_ms() == big.summary_ms() and merged.count == big.count


def test_out_of_range_values_are_counted_not_dropped() -> None:
    h = LagHistogram()
    h.record_us(10**13)
    assert h.count == 1 and h.out_of_range == 1


def test_prune_deletes_old_measurements_and_the_index_forgets_them(store: Store) -> None:
    from replag.lagindex import LagIndex

    store.append_windows([_window(i, [1000 + i]) for i in range(10)])
    index = LagIndex(store)
    before = index.summary(source="a", target="b")
    assert before.seen == 10
    deleted = store.prune(5_000)  # windows 0-4 end before 5,000 ns
    assert deleted["lag_windows"] == 5
    assert index.forget_before(5_000) == 5
    after = index.summary(source="a", target="b")
    assert after.seen == 5 and after.lag_ms["max"] is not None
    assert [w.run_id for w in store.windows()] == [f"r{i}" for i in range(5, 10)]


def test_compaction_keeps_every_figure_of_whole_windows(store: Store) -> None:
    from replag.lagindex import LagIndex

    rng = random.Random(3)
    # 60 runs, one every 10 "seconds" (here: 10,000 ns); compact into 60,000 ns windows.
    store.append_windows(
        [
            _window(i * 10, [int(rng.lognormvariate(9, 1)) for _ in range(rng.randint(1, 50))])
            for i in range(60)
        ]
    )
    index = LagIndex(store)
    before = index.summary(source="a", target="b")
    merged, written, removed = store.compact(older_than_ns=10**9, window_ns=60_000)
    assert (merged, written, len(removed)) == (60, 10, 60)
    assert index.forget_ids(removed) == 60
    after = index.summary(source="a", target="b")
    assert after == before
    assert summarize(store.windows(), source="a", target="b", replica=None) == before
    assert len(store.windows()) == 10
    # Nothing older than the cut-off left to merge: a second pass is a no-op.
    assert store.compact(older_than_ns=10**9, window_ns=60_000) == (0, 0, [])


def test_compaction_is_incremental(store: Store) -> None:
    store.append_windows([_window(i * 10, [1000 + i]) for i in range(60)])  # ends < 600,000
    assert store.compact(older_than_ns=600_000, window_ns=60_000)[:2] == (60, 10)
    # Later runs arrive; the next pass reads only from where the last one stopped.
    store.append_windows([_window(600 + i * 10, [2000 + i]) for i in range(12)])
    merged, written, _ = store.compact(older_than_ns=720_000, window_ns=60_000)
    assert (merged, written) == (12, 2)
    assert len(store.windows()) == 12
    assert sum(w.seen for w in store.windows()) == 72
