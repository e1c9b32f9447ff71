"""The results store: SQLite (WAL) holding lag windows, probe runs and, through
`ensure_schema`, the tables other components own (repair runs, alert state).

A lag window is one (source, target, replica) over a time span with its encoded
HDR histograms; any range query merges windows, which gives the same
percentiles as one big histogram over the same samples.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replag.errors import ConfigError
from replag.histogram import LagHistogram, LagSummary

_LAG_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS lag_windows (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        source TEXT NOT NULL,
        target TEXT NOT NULL,
        replica TEXT NOT NULL,
        start_ns INTEGER NOT NULL,
        end_ns INTEGER NOT NULL,
        sent INTEGER NOT NULL,
        seen INTEGER NOT NULL,
        lost INTEGER NOT NULL,
        out_of_range INTEGER NOT NULL DEFAULT 0,
        lag_hist BLOB NOT NULL,
        uncertainty_hist BLOB NOT NULL,
        write_hist BLOB NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS lag_windows_pair ON lag_windows (source, target, end_ns)",
    "CREATE INDEX IF NOT EXISTS lag_windows_end ON lag_windows (end_ns)",
    """CREATE TABLE IF NOT EXISTS probe_runs (
        run_id TEXT PRIMARY KEY,
        started_ns INTEGER NOT NULL,
        finished_ns INTEGER NOT NULL,
        source TEXT NOT NULL,
        mode TEXT NOT NULL,
        summary_json TEXT NOT NULL
    )""",
)


_META_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS store_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)


@dataclass(kw_only=True)
class LagWindow:
    """Samples of one (source, target, replica) between start_ns and end_ns (UTC epoch ns)."""

    run_id: str
    source: str
    target: str
    replica: str
    start_ns: int
    end_ns: int
    sent: int = 0
    seen: int = 0
    lost: int = 0
    lag: LagHistogram = field(default_factory=LagHistogram)
    uncertainty: LagHistogram = field(default_factory=LagHistogram)
    write: LagHistogram = field(default_factory=LagHistogram)


def summarize(
    windows: Iterable[LagWindow], *, source: str, target: str, replica: str | None
) -> LagSummary:
    """Merge `windows` into one summary (percentiles of the merged histograms)."""
    lag, unc = LagHistogram(), LagHistogram()
    sent = seen = lost = 0
    for w in windows:
        lag.merge(w.lag)
        unc.merge(w.uncertainty)
        sent, seen, lost = sent + w.sent, seen + w.seen, lost + w.lost
    unc_summary = unc.summary_ms()
    return LagSummary(
        source=source,
        target=target,
        replica=replica,
        sent=sent,
        seen=seen,
        lost=lost,
        lag_ms=lag.summary_ms(),
        uncertainty_ms={"p50": unc_summary["p50"], "max": unc_summary["max"]},
        out_of_range=lag.out_of_range,
    )


class Store:
    """One SQLite database; thread-safe through one lock (writes are small and rare)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=10
            )
            # Pages freed (a finished run's scan checkpoints) go back to the file system
            # on `reclaim`; this takes effect for stores created from now on.
            self._conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(
                f"cannot open the results store: {exc}", where=str(self.path)
            ) from None
        self._lock = threading.RLock()
        self.ensure_schema(_LAG_SCHEMA)

    def ensure_schema(self, statements: Sequence[str]) -> None:
        """Run idempotent CREATE … IF NOT EXISTS statements (each component owns its tables)."""
        with self._lock:
            for sql in statements:
                self._conn.execute(sql)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._conn.execute(sql, params).fetchall())

    def try_execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]] | None:
        """`execute`, or None at once when another thread holds the store (a write, a
        long read): for callers on an event loop, which must not wait on a lock."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return list(self._conn.execute(sql, params).fetchall())
        finally:
            self._lock.release()

    def transaction(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> None:
        """Run `statements` atomically."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self._conn.execute(sql, params)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def reclaim(self) -> None:
        """Give the file's free pages back (stores created with incremental auto-vacuum)."""
        with self._lock:
            self._conn.execute("PRAGMA incremental_vacuum")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # --- lag windows -------------------------------------------------------

    def append_windows(self, windows: Sequence[LagWindow]) -> None:
        self.transaction(_insert_window(w) for w in windows)

    def windows(
        self,
        *,
        source: str | None = None,
        target: str | None = None,
        replica: str | None = None,
        since_ns: int | None = None,
        until_ns: int | None = None,
    ) -> list[LagWindow]:
        """Windows that end within [since_ns, until_ns), oldest first."""
        clauses: list[str] = []
        params: list[str | int] = []
        for column, value in (("source", source), ("target", target), ("replica", replica)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if since_ns is not None:
            clauses.append("end_ns >= ?")
            params.append(since_ns)
        if until_ns is not None:
            clauses.append("end_ns < ?")
            params.append(until_ns)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self.execute(
            f"""SELECT run_id, source, target, replica, start_ns, end_ns, sent, seen, lost,
                out_of_range, lag_hist, uncertainty_hist, write_hist
                FROM lag_windows {where} ORDER BY end_ns, id""",
            params,
        )
        return [
            LagWindow(
                run_id=r[0],
                source=r[1],
                target=r[2],
                replica=r[3],
                start_ns=r[4],
                end_ns=r[5],
                sent=r[6],
                seen=r[7],
                lost=r[8],
                lag=LagHistogram.decode(r[10], r[9]),
                uncertainty=LagHistogram.decode(r[11]),
                write=LagHistogram.decode(r[12]),
            )
            for r in rows
        ]

    def prune(self, before_ns: int) -> dict[str, int]:
        """Delete this module's measurements (lag windows, probe runs) older than `before_ns`
        (UTC epoch ns); return rows deleted per table.

        Other components prune their own tables with the same cutoff (the service calls
        each: `AlertBook.prune_events`, `dynomite_stats.prune_stats`); repair runs are
        kept (small, and an audit trail).
        """
        deleted: dict[str, int] = {}
        with self._lock:
            for table, column in (("lag_windows", "end_ns"), ("probe_runs", "finished_ns")):
                cursor = self._conn.execute(f"DELETE FROM {table} WHERE {column} < ?", (before_ns,))
                deleted[table] = cursor.rowcount
        return deleted

    def compact(self, *, older_than_ns: int, window_ns: int) -> tuple[int, int, list[int]]:
        """Merge windows ending before `older_than_ns` into one per `window_ns` per replica.

        HDR merges are exact, so every range query over whole compacted windows gives
        the same figures as before; only the time resolution of old data coarsens.
        Incremental: each pass starts where the last one stopped (kept in `store_meta`),
        and reads a few hours at a time, releasing the lock in between, so readers on
        the service's event loop never wait long. Returns (merged, written, ids removed).
        """
        self.ensure_schema(_META_SCHEMA)
        done = self._meta("compacted_before_ns")
        first = self.execute("SELECT MIN(end_ns) FROM lag_windows WHERE end_ns >= ?", (done,))
        if first[0][0] is None:
            return 0, 0, []
        # Chunks are whole windows, so no merged window straddles two chunks.
        chunk_ns = window_ns * max(1, (6 * 3600 * 10**9) // window_ns)
        stop = older_than_ns // window_ns * window_ns
        merged_total, written_total, removed_total = 0, 0, []
        t = first[0][0] // window_ns * window_ns
        while t < stop:
            merged, written, removed = self._compact_range(t, min(t + chunk_ns, stop), window_ns)
            merged_total += merged
            written_total += written
            removed_total += removed
            t += chunk_ns
        self._set_meta("compacted_before_ns", max(done, stop))
        return merged_total, written_total, removed_total

    def _compact_range(self, lo_ns: int, hi_ns: int, window_ns: int) -> tuple[int, int, list[int]]:
        rows = self.execute(
            """SELECT id, source, target, replica, start_ns, end_ns, sent, seen, lost,
                      out_of_range, lag_hist, uncertainty_hist, write_hist
               FROM lag_windows WHERE end_ns >= ? AND end_ns < ?
               ORDER BY source, target, replica, end_ns, id""",
            (lo_ns, hi_ns),
        )
        groups: dict[tuple[str, str, str, int], list[tuple[Any, ...]]] = {}
        for row in rows:
            groups.setdefault((row[1], row[2], row[3], row[5] // window_ns), []).append(row)
        merged: list[LagWindow] = []
        removed: list[int] = []
        for (source, target, replica, _), members in groups.items():
            if len(members) < 2:
                continue
            window = LagWindow(
                run_id=f"compacted:{len(members)}",
                source=source,
                target=target,
                replica=replica,
                start_ns=min(m[4] for m in members),
                end_ns=max(m[5] for m in members),
                sent=sum(m[6] for m in members),
                seen=sum(m[7] for m in members),
                lost=sum(m[8] for m in members),
            )
            for m in members:
                window.lag.merge(LagHistogram.decode(m[10], m[9]))
                window.uncertainty.merge(LagHistogram.decode(m[11]))
                window.write.merge(LagHistogram.decode(m[12]))
            merged.append(window)
            removed += [m[0] for m in members]
        if not merged:
            return 0, 0, []
        # Insert before deleting: new ids stay above every id readers have seen (SQLite
        # reuses max(rowid) + 1), so an index that follows ids picks the merged ones up.
        statements = [_insert_window(w) for w in merged]
        statements += [
            (f"DELETE FROM lag_windows WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            for chunk in (removed[i : i + 500] for i in range(0, len(removed), 500))
        ]
        self.transaction(statements)
        return len(removed), len(merged), removed

    def _meta(self, key: str) -> int:
        rows = self.execute("SELECT value FROM store_meta WHERE key = ?", (key,))
        return int(rows[0][0]) if rows else 0

    def _set_meta(self, key: str, value: int) -> None:
        self.execute("INSERT OR REPLACE INTO store_meta (key, value) VALUES (?, ?)", (key, value))

    def pairs(self, *, since_ns: int | None = None) -> list[tuple[str, str]]:
        rows = self.execute(
            "SELECT DISTINCT source, target FROM lag_windows WHERE end_ns >= ? ORDER BY 1, 2",
            (since_ns or 0,),
        )
        return [(r[0], r[1]) for r in rows]

    def record_probe_run(
        self, *, run_id: str, started_ns: int, source: str, mode: str, summary_json: str
    ) -> None:
        self.execute(
            "INSERT OR REPLACE INTO probe_runs VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, started_ns, time.time_ns(), source, mode, summary_json),
        )


def _insert_window(w: LagWindow) -> tuple[str, Sequence[Any]]:
    return (
        """INSERT INTO lag_windows (run_id, source, target, replica, start_ns, end_ns,
           sent, seen, lost, out_of_range, lag_hist, uncertainty_hist, write_hist)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        (
            w.run_id,
            w.source,
            w.target,
            w.replica,
            w.start_ns,
            w.end_ns,
            w.sent,
            w.seen,
            w.lost,
            w.lag.out_of_range,
            w.lag.encode(),
            w.uncertainty.encode(),
            w.write.encode(),
        ),
    )
