"""Lag windows and probe runs: the store's own tables, the same on every backend.

A lag window is one (source, target, replica) over a time span with its encoded
HDR histograms; any range query merges windows, which gives the same
percentiles as one big histogram over the same samples.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from replag.histogram import LagHistogram, LagSummary
from replag.store.rows import Row, Rows

_WINDOW_COLUMNS = (
    "run_id, source, target, replica, start_ns, end_ns, sent, seen, lost, "
    "out_of_range, lag_hist, uncertainty_hist, write_hist"
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

    @classmethod
    def from_row(cls, row: Row) -> LagWindow:
        return cls(
            run_id=row.run_id,
            source=row.source,
            target=row.target,
            replica=row.replica,
            start_ns=row.start_ns,
            end_ns=row.end_ns,
            sent=row.sent,
            seen=row.seen,
            lost=row.lost,
            lag=LagHistogram.decode(bytes(row.lag_hist), row.out_of_range),
            uncertainty=LagHistogram.decode(bytes(row.uncertainty_hist)),
            write=LagHistogram.decode(bytes(row.write_hist)),
        )


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


class LagWindowTables:
    """The lag_windows and probe_runs tables, over a backend's `execute` and `transaction`."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        raise NotImplementedError

    def transaction(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> bool:
        raise NotImplementedError

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
            f"SELECT {_WINDOW_COLUMNS} FROM lag_windows {where} ORDER BY end_ns, id", params
        )
        return [LagWindow.from_row(r) for r in rows]

    def prune(self, before_ns: int) -> dict[str, int]:
        """Delete this module's measurements (lag windows, probe runs) older than `before_ns`
        (UTC epoch ns); return rows deleted per table.

        Other components prune their own tables with the same cutoff (the service calls
        each: `AlertBook.prune_events`, `dynomite_stats.prune_stats`); repair runs are
        kept (small, and an audit trail).
        """
        deleted: dict[str, int] = {}
        for table, column in (("lag_windows", "end_ns"), ("probe_runs", "finished_ns")):
            rows = self.execute(f"DELETE FROM {table} WHERE {column} < ?", (before_ns,))
            deleted[table] = max(0, rows.rowcount)
        return deleted

    def compact(self, *, older_than_ns: int, window_ns: int) -> tuple[int, int, list[int]]:
        """Merge windows ending before `older_than_ns` into one per `window_ns` per replica.

        HDR merges are exact, so every range query over whole compacted windows gives
        the same figures as before; only the time resolution of old data coarsens.
        Incremental: each pass starts where the last one stopped (kept in `store_meta`),
        and reads a few hours at a time, so readers never wait long. Returns (merged,
        written, ids removed).
        """
        done = self._meta("compacted_before_ns")
        first = self.execute(
            "SELECT MIN(end_ns) AS first_ns FROM lag_windows WHERE end_ns >= ?", (done,)
        )
        if first[0].first_ns is None:
            return 0, 0, []
        # Chunks are whole windows, so no merged window straddles two chunks.
        chunk_ns = window_ns * max(1, (6 * 3600 * 10**9) // window_ns)
        stop = older_than_ns // window_ns * window_ns
        merged_total, written_total, removed_total = 0, 0, []
        t = first[0].first_ns // window_ns * window_ns
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
            f"""SELECT id, {_WINDOW_COLUMNS} FROM lag_windows WHERE end_ns >= ? AND end_ns < ?
               ORDER BY source, target, replica, end_ns, id""",
            (lo_ns, hi_ns),
        )
        groups: dict[tuple[str, str, str, int], list[Row]] = {}
        for row in rows:
            key = (row.source, row.target, row.replica, row.end_ns // window_ns)
            groups.setdefault(key, []).append(row)
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
                start_ns=min(m.start_ns for m in members),
                end_ns=max(m.end_ns for m in members),
                sent=sum(m.sent for m in members),
                seen=sum(m.seen for m in members),
                lost=sum(m.lost for m in members),
            )
            for m in members:
                one = LagWindow.from_row(m)
                window.lag.merge(one.lag)
                window.uncertainty.merge(one.uncertainty)
                window.write.merge(one.write)
            merged.append(window)
            removed += [m.id for m in members]
        if not merged:
            return 0, 0, []
        # Insert before deleting: new ids stay above every id readers have seen (SQLite
        # reuses max(rowid) + 1), so an index that follows ids picks the merged ones up.
        statements = [insert_window(w) for w in merged]
        statements += [
            (f"DELETE FROM lag_windows WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            for chunk in _chunks(removed, 500)
        ]
        self.transaction(statements)
        return len(removed), len(merged), removed

    def _meta(self, key: str) -> int:
        rows = self.execute("SELECT value FROM store_meta WHERE key = ?", (key,))
        return int(rows[0].value) if rows else 0

    def _set_meta(self, key: str, value: int) -> None:
        self.execute(
            "INSERT INTO store_meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def pairs(self, *, since_ns: int | None = None) -> list[tuple[str, str]]:
        rows = self.execute(
            "SELECT DISTINCT source, target FROM lag_windows WHERE end_ns >= ? "
            "ORDER BY source, target",
            (since_ns or 0,),
        )
        return [(r.source, r.target) for r in rows]

    def record_probe_run(
        self, *, run_id: str, started_ns: int, source: str, mode: str, summary_json: str
    ) -> None:
        self.execute(
            """INSERT INTO probe_runs (run_id, started_ns, finished_ns, source, mode, summary_json)
               VALUES (?, ?, ?, ?, ?, ?)
               ON CONFLICT (run_id) DO UPDATE SET started_ns = excluded.started_ns,
                   finished_ns = excluded.finished_ns, source = excluded.source,
                   mode = excluded.mode, summary_json = excluded.summary_json""",
            (run_id, started_ns, time.time_ns(), source, mode, summary_json),
        )


def insert_window(w: LagWindow) -> tuple[str, Sequence[Any]]:
    return (
        f"INSERT INTO lag_windows ({_WINDOW_COLUMNS}) VALUES ({', '.join('?' * 13)})",
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


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
