"""LagIndex (the API's cache) gives exactly the figures of merging the stored HDR windows."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from replag.api.lag import FRESH_WAIT_S, _cached
from replag.lagindex import LagIndex
from replag.store import LagWindow, Store, summarize
from tests.helpers import waiting


def test_index_summaries_equal_store_summaries(tmp_path: Path) -> None:
    rng = random.Random(11)
    store = Store(tmp_path / "s.sqlite")
    windows = []
    for i in range(300):  # several of the index's 64-window chunks
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
        for _ in range(rng.randint(0, 200)):
            w.lag.record_us(rng.lognormvariate(rng.uniform(1, 14), 1.5))
            w.uncertainty.record_us(rng.uniform(0, 500))
        if i == 7:
            w.lag.record_us(5e9)  # beyond the trackable range: counted, not dropped
        windows.append(w)
    store.append_windows(windows[:140])
    index = LagIndex(store)
    assert index.summary("a", "b").sent == 140 * 100
    store.append_windows(windows[140:])  # picked up on the next query, not cached stale
    ranges = [(None, None), (100, 300), (0, 1), (55, 56), (250, None), (640, 1290), (635, 2925)]
    for since, until in ranges:
        stored = store.windows(source="a", target="b", since_ns=since, until_ns=until)
        expected = summarize(stored, source="a", target="b", replica=None)
        assert index.summary("a", "b", since_ns=since, until_ns=until) == expected
        assert index.summary("a", "b", since_ns=since, until_ns=until) == expected  # cached
    assert index.summary("a", "b", replica="b1") == summarize(
        store.windows(source="a", target="b", replica="b1"), source="a", target="b", replica="b1"
    )
    series = index.series("a", "b", since_ns=0, until_ns=3000, step_ns=500)
    assert [start for start, _ in series] == [0, 500, 1000, 1500, 2000, 2500]
    assert sum(s.sent for _, s in series) == 300 * 100
    assert index.hits >= 5
    # Per replica, over any range: exactly the replica's own windows merged.
    for replica in ("b0", "b1"):
        for since, until in ranges:
            stored = store.windows(
                source="a", target="b", replica=replica, since_ns=since, until_ns=until
            )
            expected = summarize(stored, source="a", target="b", replica=replica)
            got = index.summary("a", "b", since_ns=since, until_ns=until, replica=replica)
            assert got == expected
        own = index.series("a", "b", since_ns=0, until_ns=3000, step_ns=500, replica=replica)
        assert sum(s.sent for _, s in own) == 150 * 100 and {s.replica for _, s in own} == {replica}
    assert index.replicas() == [("a", "b", "b0"), ("a", "b", "b1")]


def test_a_region_of_one_replica_is_computed_once_for_both(tmp_path: Path) -> None:
    """A pair whose every window is one replica's: the replica's figures are the pair's
    (the same answer, labelled with the replica), not a second merge."""
    store = Store(tmp_path / "s.sqlite")
    windows = []
    for i in range(10):
        w = LagWindow(run_id="r", source="a", target="b", replica="b-1", start_ns=i,
                      end_ns=i + 1, sent=10, seen=10, lost=0)  # fmt: skip
        w.lag.record_us(1000 + i)
        windows.append(w)
    store.append_windows(windows)
    index = LagIndex(store)
    pair = index.summary("a", "b")
    misses = index.misses
    replica = index.summary("a", "b", replica="b-1")
    assert index.misses == misses  # answered from the pair's cached summary
    assert replica.replica == "b-1" and replica.sent == pair.sent == 100
    assert replica.lag_ms == pair.lag_ms
    assert replica == summarize(windows, source="a", target="b", replica="b-1")


async def test_a_slow_recomputation_serves_the_recent_answer_marked_not_fresh(
    tmp_path: Path,
) -> None:
    index = LagIndex(Store(tmp_path / "s.sqlite"))
    index.serve_recent = True  # as under `replag serve`
    family = ("matrix", "24h")

    release = threading.Event()

    def slow() -> bytes:
        # Outlasts the request's FRESH_WAIT_S by construction, not by racing a timer: a busy
        # host can run a 40 ms computation to its end before the loop gets back to the wait.
        release.wait(30)
        return b"new"

    # No previous answer: the request waits for the computation.
    assert await _cached(index, (*family, 1), family, lambda: b"first") == (b"first", True)
    # A window arrived (a new key): the previous answer, while the new one is computed...
    try:
        assert await _cached(index, (*family, 2), family, slow) == (b"first", False)
    finally:
        release.set()
    # ...which is what the query answers once it is done.
    await waiting.until(lambda: index.recent(family, max_age_s=5) == b"new", "the new answer kept")
    assert await _cached(index, (*family, 2), family, slow) == (b"new", True)


async def test_without_the_schedules_a_recomputation_is_waited_for(tmp_path: Path) -> None:
    index = LagIndex(Store(tmp_path / "s.sqlite"))
    family = ("series", "a", "b")
    assert await _cached(index, (*family, 1), family, lambda: b"one") == (b"one", True)
    assert await _cached(index, (*family, 2), family, lambda: b"two") == (b"two", True)

    def slow() -> bytes:
        time.sleep(FRESH_WAIT_S * 20)
        return b"three"

    assert await _cached(index, (*family, 3), family, slow) == (b"three", True)
