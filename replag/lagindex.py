"""Fast range queries over the store's lag windows, for the API, the dashboard and alert rules.

`LagHistogram.summary_ms()` walks 23,552 HDR buckets in Python (~50 ms), and a
day of one-minute windows is 1,440 histograms per pair, so answering
`/api/v1/lag/matrix` from scratch per request cannot meet a 20 ms budget.
`LagIndex` keeps, in memory, the (end_ns, id) of every window per pair and per
replica (a pair's figures are its region roll-up: every replica's windows
merged), each window's histograms as sparse numpy arrays (decoded once), and an
LRU of finished answers keyed by the exact set of windows they cover. The
figures are the same as `replag.store.summarize` gives (a test checks it).
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from replag.errors import StoreError
from replag.histogram import LagHistogram, SparseHistogram
from replag.histogram import LagSummary as LagSummary
from replag.store import Store

_T = TypeVar("_T")
_LOAD_CHUNK = 500  # ids per SELECT … IN (…); SQLite allows 999 parameters by default
# Under the service, queries look for new windows at most this often: each look is a
# SELECT, and on a busy host getting the GIL back after one took milliseconds.
_QUERY_REFRESH_S = 0.1
# On PostgreSQL, the service's refreshes re-read this many ids below the highest seen.
_ID_LOOKBACK = 256
# Under the service, windows ending within this long ago are decoded as they arrive (what
# the index warm-up decodes at start); older ones when a query first covers them.
_DECODE_AHEAD_NS = 86_400 * 10**9
_CHUNK = 64  # windows merged ahead into one cached part (about an hour of one-minute windows)


class NotCached(LookupError):
    """`LagIndex.answer(may_compute=False)` found no cached value."""


@dataclass(frozen=True, slots=True)
class WindowStats:
    """What a summary needs from one stored window, decoded once."""

    sent: int
    seen: int
    lost: int
    lag: SparseHistogram
    uncertainty: SparseHistogram


def summarize_stats(
    stats: Sequence[WindowStats], *, source: str, target: str, replica: str | None
) -> LagSummary:
    lag = SparseHistogram.merge([s.lag for s in stats])
    unc = SparseHistogram.merge([s.uncertainty for s in stats]).summary_ms()
    return LagSummary(
        source=source,
        target=target,
        replica=replica,
        sent=sum(s.sent for s in stats),
        seen=sum(s.seen for s in stats),
        lost=sum(s.lost for s in stats),
        lag_ms=lag.summary_ms(),
        uncertainty_ms={"p50": unc["p50"], "max": unc["max"]},
        out_of_range=lag.out_of_range,
    )


# (source, target, replica): a replica's windows; replica None: the pair's, every replica's.
SeriesKey = tuple[str, str, str | None]


class _PairWindows:
    """Windows of one (source, target[, replica]), sorted by (end_ns, id)."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.generation = 0  # bumped on every insert: (generation, lo, hi) names a window set

    def add(self, end_ns: int, window_id: int) -> None:
        # Copy on write: a query holding `keys` from before keeps a consistent view without
        # copying 1,440 entries per request. Windows arrive about once a minute, so this is cheap.
        keys = list(self.keys)
        bisect.insort(keys, (end_ns, window_id))
        self.keys = keys
        self.generation += 1

    def drop_before(self, end_ns: int) -> list[int]:
        """Forget windows ending before `end_ns`; return their ids."""
        cut = bisect.bisect_left(self.keys, (end_ns, -1))
        if not cut:
            return []
        dropped = [window_id for _, window_id in self.keys[:cut]]
        self.keys = self.keys[cut:]
        self.generation += 1
        return dropped

    def drop_ids(self, ids: set[int]) -> int:
        keys = [k for k in self.keys if k[1] not in ids]
        dropped = len(self.keys) - len(keys)
        if dropped:
            self.keys = keys
            self.generation += 1
        return dropped

    def span(self, since_ns: int | None, until_ns: int | None) -> tuple[int, int]:
        """Positions [lo, hi) of windows ending within [since_ns, until_ns), as Store.windows."""
        lo = 0 if since_ns is None else bisect.bisect_left(self.keys, (since_ns, -1))
        hi = len(self.keys) if until_ns is None else bisect.bisect_left(self.keys, (until_ns, -1))
        return lo, max(lo, hi)


@dataclass(slots=True)
class RangeEdges:
    """Where a range [since, until) may move and hold the same windows of every pair:
    `since` within (before, first], `until` within (last, after]."""

    before: float = float("-inf")
    first: float = float("inf")
    last: float = float("-inf")
    after: float = float("inf")

    def cover(self, keys: Sequence[tuple[int, int]], lo: int, hi: int) -> None:
        if lo > 0:
            self.before = max(self.before, keys[lo - 1][0])
        if lo < len(keys):
            self.first = min(self.first, keys[lo][0])
        if hi > 0:
            self.last = max(self.last, keys[hi - 1][0])
        if hi < len(keys):
            self.after = min(self.after, keys[hi][0])

    def hold(self, since_ns: int, until_ns: int) -> bool:
        return self.before < since_ns <= self.first and self.last < until_ns <= self.after


class LagIndex:
    """Cached, exact lag summaries over any time range; thread-safe (API calls run in threads)."""

    def __init__(self, store: Store, *, max_cached_answers: int = 16384) -> None:
        self.store = store
        self._pairs: dict[SeriesKey, _PairWindows] = {}
        self._stats: dict[int, WindowStats] = {}
        self._answers: OrderedDict[Hashable, Any] = OrderedDict()
        self._computing: dict[Hashable, threading.Event] = {}
        self._max_answers = max_cached_answers
        self._last_id = 0
        # The last ids indexed, so a look back (see refresh) adds none twice.
        self._recent_order: deque[int] = deque()
        self._recent_ids: set[int] = set()
        self._lock = threading.RLock()
        self._refreshing = threading.Lock()
        self._recent: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        # Whether queries may be answered from `recent` while their answer is computed
        # (the service turns it on when its schedules start adding windows).
        self.serve_recent = False
        self._refreshed = 0.0
        self.hits = self.misses = 0
        # Windows the store could not write yet (Store.unsaved_windows), indexed under ids
        # of their own below 0, never reused: id(window object) → that id.
        # Why the last read of the store failed (None once one succeeds): the API marks its
        # answers not fresh and health names it, so an index left empty is never silent.
        self.load_error: str | None = None
        self._unsaved: dict[int, int] = {}
        self._unsaved_generation = 0
        self._next_unsaved_id = -1
        # Bumped whenever any pair's windows change: an answer built at one generation
        # stays right, for the same range, until it moves (see `edges`).
        self.generation = 0
        # Under the service its schedules pick up new windows (`refresh` and
        # `decode_new`, in a thread of their own), so queries never read the store on the
        # API's event loop, and answers never wait for a window to be read and decoded.
        self.followed = False
        self._undecoded: list[int] = []

    def refresh(self, *, wait: bool = True) -> None:
        """Pick up windows appended since the last call (by anyone: service, cron probes).

        With `wait=False` (what queries do: they run on the API's event loop) nothing
        is picked up while another thread holds the store or is refreshing, nor, under
        the service (`serve_recent`), within `_QUERY_REFRESH_S` of the last look: the
        query answers from what is indexed, and the service refreshes after each round.
        The store is read without holding the index, so a query never waits behind a
        refresh that waits for the store.
        """
        if not wait and (
            self.followed
            or (self.serve_recent and time.monotonic() - self._refreshed < _QUERY_REFRESH_S)
        ):
            return
        if not self._refreshing.acquire(blocking=wait):
            return
        try:
            self._refreshed = time.monotonic()
            query = (
                "SELECT id, source, target, replica, end_ns FROM lag_windows WHERE id > ? "
                "ORDER BY id"
            )
            after = self._last_id
            if wait and self.store.backend == "postgresql":
                # Ids are handed out at insert, not at commit: with several writers a
                # window can become visible after a higher id did. Look back a little.
                after = max(0, after - _ID_LOOKBACK)
            try:
                if wait:
                    rows = self.store.execute(query, (after,))
                else:
                    found = self.store.try_execute(query, (after,))
                    if found is None:
                        return
                    rows = found
            except StoreError as exc:
                self.load_error = str(exc)
                # The store away: what this process measured meanwhile is still served.
                if self.store.unsaved_generation != self._unsaved_generation:
                    self._follow_unsaved()
                raise
            self.load_error = None
            recent_ns = time.time_ns() - _DECODE_AHEAD_NS
            with self._lock:
                for window_id, source, target, replica, end_ns in rows:
                    if window_id <= self._last_id and window_id in self._recent_ids:
                        continue
                    for key in ((source, target, None), (source, target, replica)):
                        self._pairs.setdefault(key, _PairWindows()).add(end_ns, window_id)
                    self._last_id = max(self._last_id, window_id)
                    self._recent_order.append(window_id)
                    self._recent_ids.add(window_id)
                    if len(self._recent_order) > 4 * _ID_LOOKBACK:
                        self._recent_ids.discard(self._recent_order.popleft())
                    self.generation += 1
                    if self.followed and end_ns >= recent_ns:
                        self._undecoded.append(window_id)  # see decode_new
            if self.store.unsaved_generation != self._unsaved_generation:
                self._follow_unsaved()
        finally:
            self._refreshing.release()

    def _follow_unsaved(self) -> None:
        """Index the windows the store holds in memory (it could not write them): probing
        goes on when the store is full, and so do the figures and the alerts on them.
        Once written they arrive by id like any other, and their stand-ins go."""
        generation = self.store.unsaved_generation
        windows = {id(w): w for w in self.store.unsaved_windows}
        with self._lock:
            gone = [wid for key, wid in self._unsaved.items() if key not in windows]
            self._unsaved = {k: v for k, v in self._unsaved.items() if k in windows}
            for key, w in windows.items():
                if key in self._unsaved:
                    continue
                window_id = self._unsaved[key] = self._next_unsaved_id
                self._next_unsaved_id -= 1
                self._stats[window_id] = _stats_of(w.sent, w.seen, w.lost, w.lag, w.uncertainty)
                for pair in ((w.source, w.target, None), (w.source, w.target, w.replica)):
                    self._pairs.setdefault(pair, _PairWindows()).add(w.end_ns, window_id)
            self._unsaved_generation = generation
            self.generation += 1
            if windows:
                self._answers.clear()
        if gone:
            self.forget_ids(gone)

    def decode_new(self) -> int:
        """Read and decode the windows picked up since the last call (what a query would
        otherwise do when it first covers them); return how many."""
        with self._lock:
            ids, self._undecoded = self._undecoded, []
        if ids:
            self._load(ids)
        return len(ids)

    def forget_before(self, end_ns: int) -> int:
        """Drop windows ending before `end_ns` (pruned from the store); return how many."""
        with self._lock:
            # Every window is in its pair's list and its replica's: count the pairs' only.
            dropped = {key: w.drop_before(end_ns) for key, w in self._pairs.items() if w.keys}
            for ids in dropped.values():
                for window_id in ids:
                    self._stats.pop(window_id, None)
            gone = sum(len(ids) for key, ids in dropped.items() if key[2] is None)
            if gone:
                self.generation += 1
                self._answers.clear()
            return gone

    def forget_ids(self, ids: Sequence[int]) -> int:
        """Drop windows replaced by compaction (their merged window arrives on refresh)."""
        gone = set(ids)
        with self._lock:
            dropped = sum(w.drop_ids(gone) for k, w in self._pairs.items() if k[2] is None)
            for w in [w for k, w in self._pairs.items() if k[2] is not None]:
                w.drop_ids(gone)
            for window_id in gone:
                self._stats.pop(window_id, None)
            if dropped:
                self.generation += 1
                self._answers.clear()
            return dropped

    def pairs(
        self, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[tuple[str, str]]:
        """(source, target) pairs with a window ending within the range."""
        return [(s, t) for s, t, r in self._keys(since_ns, until_ns) if r is None]

    def replicas(
        self, *, since_ns: int | None = None, until_ns: int | None = None
    ) -> list[tuple[str, str, str]]:
        """(source, target, replica) with a window ending within the range."""
        return [(s, t, r) for s, t, r in self._keys(since_ns, until_ns) if r is not None]

    def _keys(self, since_ns: int | None, until_ns: int | None) -> list[SeriesKey]:
        self.refresh(wait=False)
        with self._lock:
            spans = {key: w.span(since_ns, until_ns) for key, w in self._pairs.items()}
        return sorted(
            (key for key, (lo, hi) in spans.items() if hi > lo),
            key=lambda k: (k[0], k[1], k[2] or ""),
        )

    def latest_end_ns(self, source: str, target: str, replica: str | None = None) -> int | None:
        """When the pair's (or its replica's) newest window ended, if it has one."""
        self.refresh(wait=False)
        with self._lock:
            pair = self._pairs.get((source, target, replica))
            return pair.keys[-1][0] if pair is not None and pair.keys else None

    def last_seen_end_ns(self, source: str, target: str, replica: str | None = None) -> int | None:
        """The end of the newest window of the pair (or replica) in which a probe was seen."""
        query = (
            "SELECT MAX(end_ns) AS last_ns FROM lag_windows "
            "WHERE source = ? AND target = ? AND seen > 0"
        )
        params: tuple[str, ...] = (source, target)
        if replica is not None:
            query += " AND replica = ?"
            params += (replica,)
        try:
            rows = self.store.execute(query, params, last_known=True)
        except StoreError as exc:
            self.load_error = str(exc)  # the store away, and this never read: unknown
            return None
        return rows[0].last_ns if rows else None

    def recovered_end_ns(self, source: str, target: str) -> int | None:
        """The end of the first window in which the pair saw probes again after its newest
        window that saw none (it sent some): when it recovered; None if it never lost all."""
        try:
            rows = self.store.execute(
                "SELECT MAX(end_ns) AS down_ns FROM lag_windows "
                "WHERE source = ? AND target = ? AND sent > 0 AND seen = 0",
                (source, target),
                last_known=True,
            )
            down = rows[0].down_ns if rows else None
            if down is None:
                return None
            rows = self.store.execute(
                "SELECT MIN(end_ns) AS up_ns FROM lag_windows "
                "WHERE source = ? AND target = ? AND seen > 0 AND end_ns > ?",
                (source, target, down),
                last_known=True,
            )
        except StoreError as exc:
            self.load_error = str(exc)  # the store away, and this never read: unknown
            return None
        return rows[0].up_ns if rows else None

    def summary(
        self,
        source: str,
        target: str,
        *,
        since_ns: int | None = None,
        until_ns: int | None = None,
        replica: str | None = None,
    ) -> LagSummary:
        """Merged percentiles of the windows ending within [since_ns, until_ns): the pair's
        (every replica's windows), or one `replica`'s."""
        self.refresh(wait=False)
        if replica is not None and self._sole_replica(source, target, replica):
            whole = self.summary(source, target, since_ns=since_ns, until_ns=until_ns)
            return dataclasses.replace(whole, replica=replica)
        with self._lock:
            pair = self._pairs.get((source, target, replica), _PairWindows())
            lo, hi = pair.span(since_ns, until_ns)
            key = ("summary", source, target, replica, pair.generation, lo, hi)
            keys = pair.keys

        def compute() -> LagSummary:
            parts = self._chunked([window_id for _, window_id in keys], lo, hi)
            return summarize_stats(parts, source=source, target=target, replica=replica)

        return self._answer(key, compute)

    def _sole_replica(self, source: str, target: str, replica: str) -> bool:
        """Whether every window of the pair is this replica's (a region of one replica):
        its figures are then the pair's, computed (and cached) once."""
        with self._lock:
            pair = self._pairs.get((source, target, None))
            own = self._pairs.get((source, target, replica))
            return pair is not None and own is not None and len(own.keys) == len(pair.keys)

    def series(
        self,
        source: str,
        target: str,
        *,
        since_ns: int,
        until_ns: int,
        step_ns: int,
        replica: str | None = None,
    ) -> list[tuple[int, LagSummary]]:
        """(bucket start, summary) per epoch-aligned step-long bucket holding a window's end,
        of the pair (every replica) or of one `replica`."""
        self.refresh(wait=False)
        if replica is not None and self._sole_replica(source, target, replica):
            whole = self.series(
                source, target, since_ns=since_ns, until_ns=until_ns, step_ns=step_ns
            )
            return [(start, dataclasses.replace(s, replica=replica)) for start, s in whole]
        with self._lock:
            pair = self._pairs.get((source, target, replica), _PairWindows())
            lo, hi = pair.span(since_ns, until_ns)
            all_keys = pair.keys
            key = ("series", source, target, replica, pair.generation, lo, hi, step_ns)

        def compute() -> list[tuple[int, LagSummary]]:
            keys = all_keys[lo:hi]
            # A window compacted away meanwhile is simply absent (its merged window arrives
            # on the next refresh, when the cache is cleared).
            stats = self._load_map([k[1] for k in keys])
            buckets: dict[int, list[int]] = {}
            for end_ns, window_id in keys:
                if window_id not in stats:
                    continue
                # Buckets aligned to the epoch, not to `since`, so a sliding "last 24h"
                # keeps its buckets (and its cache entry) from one request to the next.
                buckets.setdefault(end_ns // step_ns * step_ns, []).append(window_id)

            def bucket(ids: list[int]) -> LagSummary:
                parts = [stats[i] for i in ids]
                return summarize_stats(parts, source=source, target=target, replica=replica)

            # A new window changes one bucket: the others come from the cache, so a series
            # costs one merge per probe round, not one per bucket of the range.
            return [
                (
                    start,
                    self._answer(
                        ("bucket", source, target, replica, tuple(ids)), partial(bucket, ids)
                    ),
                )
                for start, ids in sorted(buckets.items())
            ]

        return self._answer(key, compute)

    def warm(self, *, since_ns: int | None = None) -> int:
        """Decode every window ending since `since_ns` now (the service does it in a thread at
        start), so the first dashboard load after a restart is not the one that pays."""
        self.refresh()
        with self._lock:
            ids = {
                i
                for (_, _, replica), w in self._pairs.items()
                if replica is None
                for _, i in w.keys[w.span(since_ns, None)[0] :]
            }
        try:
            return len(self._load(sorted(ids)))
        except StoreError as exc:
            self.load_error = f"warm-up: {exc}"
            raise

    def signature(
        self, *, since_ns: int | None, until_ns: int | None
    ) -> tuple[tuple[str, str, int, int, int], ...]:
        """Names the exact set of windows in range per pair: equal signatures, equal answers
        (also per replica: a pair's windows are its replicas' windows)."""
        self.refresh(wait=False)
        with self._lock:
            return tuple(
                (source, target, windows.generation, *windows.span(since_ns, until_ns))
                for (source, target, _), windows in sorted(
                    ((k, w) for k, w in self._pairs.items() if k[2] is None),
                    key=lambda kw: kw[0][:2],
                )
            )

    def edges(
        self, *, since_ns: int | None, until_ns: int | None
    ) -> tuple[int, tuple[tuple[str, str, int, int, int], ...], RangeEdges]:
        """(generation, signature, edges): the signature of the range and how far its ends
        may move with the same windows in it (an answer built now stays right while the
        generation is the same and the range is within the edges)."""
        self.refresh(wait=False)
        with self._lock:
            generation = self.generation
            pairs = sorted(
                ((k, w) for k, w in self._pairs.items() if k[2] is None), key=lambda kw: kw[0][:2]
            )
            signature = []
            edges = RangeEdges()
            for (source, target, _), windows in pairs:
                lo, hi = windows.span(since_ns, until_ns)
                signature.append((source, target, windows.generation, lo, hi))
                edges.cover(windows.keys, lo, hi)
        return generation, tuple(signature), edges

    def answer(self, key: Hashable, compute: Callable[[], _T], *, may_compute: bool = True) -> _T:
        """The cached value for `key`, else `compute()` (or NotCached if not `may_compute`).

        Callers on the event loop pass may_compute=False and retry in a thread on
        NotCached, so a cache miss never blocks the loop.
        """
        return self._answer(key, compute, may_compute=may_compute)

    def remember(self, family: Hashable, value: Any) -> None:
        """`value` is the current answer of the query `family` (its key minus the window
        set) as of now: `recent` may hand it out while the next answer is computed."""
        with self._lock:
            self._recent[family] = (time.monotonic(), value)
            self._recent.move_to_end(family)
            while len(self._recent) > self._max_answers:
                self._recent.popitem(last=False)

    def recent(self, family: Hashable, *, max_age_s: float) -> Any | None:
        """The answer `remember`ed for `family` if it was current `max_age_s` ago or later."""
        with self._lock:
            found = self._recent.get(family)
        if found is None or time.monotonic() - found[0] > max_age_s:
            return None
        return found[1]

    # --- internals -----------------------------------------------------------

    def _answer(self, key: Hashable, compute: Callable[[], _T], *, may_compute: bool = True) -> _T:
        while True:
            with self._lock:
                if key in self._answers:
                    self.hits += 1
                    self._answers.move_to_end(key)
                    cached: _T = self._answers[key]
                    return cached
                if not may_compute:
                    raise NotCached(key)
                running = self._computing.get(key)
                if running is None:
                    # Single flight: when a window ages out, every client asks for the same
                    # new answer at once; one thread computes it and the others wait for it.
                    running = self._computing[key] = threading.Event()
                    self.misses += 1
                    break
            running.wait()
        try:
            value = compute()
            with self._lock:
                self._answers[key] = value
                while len(self._answers) > self._max_answers:
                    self._answers.popitem(last=False)
        finally:
            with self._lock:
                del self._computing[key]
            running.set()
        return value

    def _chunked(self, ids: Sequence[int], lo: int, hi: int) -> list[WindowStats]:
        """The windows ids[lo:hi] as stats to merge: whole aligned chunks of _CHUNK windows
        merged once and cached (keyed by their ids), the ragged ends window by window.

        A probe round adds a window and so changes every range's answer; this way the
        new answer for a day merges ~22 chunks and the ends, not 1,440 windows (a
        recomputation that took the 24 h matrix 70 ms and stalled the API behind it).
        """
        first = -(-lo // _CHUNK) * _CHUNK
        last = hi // _CHUNK * _CHUNK
        if first >= last:
            return self._load(ids[lo:hi])
        chunks = [
            self._answer(("chunk", chunk), partial(self._merged, chunk))
            for chunk in (tuple(ids[c : c + _CHUNK]) for c in range(first, last, _CHUNK))
        ]
        return self._load(ids[lo:first]) + chunks + self._load(ids[last:hi])

    def _merged(self, ids: Sequence[int]) -> WindowStats:
        stats = self._load(ids)
        return WindowStats(
            sent=sum(s.sent for s in stats),
            seen=sum(s.seen for s in stats),
            lost=sum(s.lost for s in stats),
            lag=SparseHistogram.merge([s.lag for s in stats]),
            uncertainty=SparseHistogram.merge([s.uncertainty for s in stats]),
        )

    def _load_map(self, ids: Sequence[int]) -> dict[int, WindowStats]:
        with self._lock:
            missing = [i for i in ids if i not in self._stats]
        for start in range(0, len(missing), _LOAD_CHUNK):
            chunk = missing[start : start + _LOAD_CHUNK]
            try:
                rows = self.store.execute(
                    f"""SELECT id, sent, seen, lost, out_of_range, lag_hist, uncertainty_hist
                        FROM lag_windows WHERE id IN ({",".join("?" * len(chunk))})""",
                    chunk,
                )
            except StoreError as exc:
                # The store away: answer from the windows decoded already (and those held
                # in memory); the answer says it is not fresh (load_error).
                self.load_error = str(exc)
                break
            decoded = {
                r[0]: _stats_of(
                    r[1], r[2], r[3], LagHistogram.decode(r[5], r[4]), LagHistogram.decode(r[6])
                )
                for r in rows
            }
            with self._lock:
                self._stats.update(decoded)
        with self._lock:
            return {i: self._stats[i] for i in ids if i in self._stats}

    def _load(self, ids: Sequence[int]) -> list[WindowStats]:
        return list(self._load_map(ids).values())


def _stats_of(
    sent: int, seen: int, lost: int, lag: LagHistogram, uncertainty: LagHistogram
) -> WindowStats:
    return WindowStats(
        sent=sent,
        seen=seen,
        lost=lost,
        lag=SparseHistogram.from_lag_histogram(lag),
        uncertainty=SparseHistogram.from_lag_histogram(uncertainty),
    )
