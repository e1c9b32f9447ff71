"""LagIndex (the API's cache) gives exactly the figures of merging the stored HDR windows."""

from __future__ import annotations

import random
from pathlib import Path

from replag.lagindex import LagIndex
from replag.store import LagWindow, Store, summarize


def test_index_summaries_equal_store_summaries(tmp_path: Path) -> None:
    rng = random.Random(11)
    store = Store(tmp_path / "s.sqlite")
    windows = []
    for i in range(60):
        w = LagWindow(
            run_id="r",
            source="a",
            target="b",
            replica=f"b{i % 2}",
            start_ns=i * 10,
            end_ns=i * 10 + 5,
            sent=100,
            seen=97,
            lost=3,
        )
        for _ in range(rng.randint(0, 300)):
            w.lag.record_us(rng.lognormvariate(rng.uniform(1, 14), 1.5))
            w.uncertainty.record_us(rng.uniform(0, 500))
        if i == 7:
            w.lag.record_us(5e9)  # beyond the trackable range: counted, not dropped
        windows.append(w)
    store.append_windows(windows[:40])
    index = LagIndex(store)
    assert index.summary("a", "b").sent == 40 * 100
    store.append_windows(windows[40:])  # picked up on the next query, not cached stale
    for since, until in [(None, None), (100, 300), (0, 1), (55, 56), (250, None)]:
        stored = store.windows(source="a", target="b", since_ns=since, until_ns=until)
        expected = summarize(stored, source="a", target="b", replica=None)
        assert index.summary("a", "b", since_ns=since, until_ns=until) == expected
        assert index.summary("a", "b", since_ns=since, until_ns=until) == expected  # cached
    assert index.summary("a", "b", replica="b1") == summarize(
        store.windows(source="a", target="b", replica="b1"), source="a", target="b", replica="b1"
    )
    series = index.series("a", "b", since_ns=0, until_ns=600, step_ns=100)
    assert [start for start, _ in series] == [0, 100, 200, 300, 400, 500]
    assert sum(s.sent for _, s in series) == 60 * 100
    assert index.hits >= 5
