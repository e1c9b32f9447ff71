"""Repair runs in the store: what a run was asked to do, how far it got, what it found.

A run survives Ctrl-C and crashes: each replica's scan is checkpointed (SCAN
cursor plus the Tictac tree of the keys before it), the verified divergent
keys are written before any repair, and every key's outcome is recorded as it
happens, so `--resume RUN_ID` redoes neither a finished scan nor a finished key.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable
from typing import Any

from replag.repair.scan import ScanProgress
from replag.repair.tictac import TictacTree
from replag.store import Store

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS repair_runs (
        run_id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        started_ns INTEGER NOT NULL,
        finished_ns INTEGER,
        params_json TEXT NOT NULL,
        report_json TEXT,
        error TEXT
    )""",
    # One row per replica being scanned, rewritten at each checkpoint: the cursor and
    # the Tictac tree of the keys before it (512 KB at depth 16, whatever the keyspace).
    """CREATE TABLE IF NOT EXISTS repair_scan_state (
        run_id TEXT NOT NULL,
        group_name TEXT NOT NULL,
        replica TEXT NOT NULL,
        cursor BLOB NOT NULL,
        keys INTEGER NOT NULL,
        seconds REAL NOT NULL,
        finished INTEGER NOT NULL,
        total INTEGER,
        tree BLOB NOT NULL,
        PRIMARY KEY (run_id, group_name, replica)
    )""",
    # Checkpoints used to hold every key scanned (tens of MB a run): gone.
    "DROP TABLE IF EXISTS repair_scan_chunks",
    """CREATE TABLE IF NOT EXISTS repair_groups (
        run_id TEXT NOT NULL,
        group_name TEXT NOT NULL,
        phase TEXT NOT NULL,
        stats_json TEXT NOT NULL,
        PRIMARY KEY (run_id, group_name)
    )""",
    """CREATE TABLE IF NOT EXISTS repair_keys (
        run_id TEXT NOT NULL,
        group_name TEXT NOT NULL,
        key BLOB NOT NULL,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        detail_json TEXT NOT NULL,
        PRIMARY KEY (run_id, group_name, key)
    )""",
    "CREATE INDEX IF NOT EXISTS repair_runs_started ON repair_runs (started_ns)",
)

RUNNING, INTERRUPTED, FAILED, DONE = "running", "interrupted", "failed", "done"


def resume_command(kind: str, run_id: str, config: str | None = None) -> str:
    """The command that continues run `run_id` of `kind` (check, repair or rebuild)."""
    where = f" -c {config}" if config else ""
    command = kind if kind in ("check", "rebuild") else "run"
    return f"replag repair {command}{where} --resume {run_id}"


def resumable(status: str) -> bool:
    """Interrupted, failed, or still marked running (its process may have died)."""
    return status != DONE


def new_run_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


class RunLog:
    """One run's rows in the store."""

    def __init__(self, store: Store, run_id: str) -> None:
        store.ensure_schema(SCHEMA)
        self.store = store
        self.run_id = run_id

    @classmethod
    def create(cls, store: Store, *, kind: str, params: dict[str, Any]) -> RunLog:
        log = cls(store, new_run_id(kind))
        store.execute(
            "INSERT INTO repair_runs (run_id, kind, status, started_ns, params_json) "
            "VALUES (?, ?, ?, ?, ?)",
            (log.run_id, kind, RUNNING, time.time_ns(), json.dumps(params)),
        )
        return log

    def row(self) -> tuple[str, str, dict[str, Any]] | None:
        """(kind, status, params) of this run, None if it does not exist."""
        rows = self.store.execute(
            "SELECT kind, status, params_json FROM repair_runs WHERE run_id = ?", (self.run_id,)
        )
        if not rows:
            return None
        kind, status, params = rows[0]
        return str(kind), str(status), dict(json.loads(params))

    def set_status(
        self, status: str, *, report: dict[str, Any] | None = None, error: str | None = None
    ) -> None:
        finished = time.time_ns() if status != RUNNING else None
        self.store.execute(
            "UPDATE repair_runs SET status = ?, finished_ns = ?, "
            "report_json = COALESCE(?, report_json), error = ? WHERE run_id = ?",
            (
                status,
                finished,
                json.dumps(report) if report is not None else None,
                error,
                self.run_id,
            ),
        )

    # --- scan checkpoints ---------------------------------------------------

    def save_scan(self, group: str, state: ScanProgress, tree: TictacTree) -> None:
        """Where `state.replica`'s scan stands and the tree of the keys before it."""
        self.store.execute(
            "INSERT OR REPLACE INTO repair_scan_state VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self.run_id,
                group,
                state.replica,
                state.cursor,
                state.keys,
                state.seconds,
                int(state.finished),
                state.total,
                tree.to_bytes(),
            ),
        )

    def load_scan(self, group: str, replica: str) -> tuple[ScanProgress, TictacTree | None]:
        """The last checkpoint of `replica`'s scan (a fresh start and None if there is none)."""
        rows = self.store.execute(
            "SELECT cursor, keys, seconds, finished, total, tree FROM repair_scan_state "
            "WHERE run_id = ? AND group_name = ? AND replica = ?",
            (self.run_id, group, replica),
        )
        if not rows:
            return ScanProgress(replica), None
        cursor, keys, seconds, finished, total, tree = rows[0]
        state = ScanProgress(replica, bytes(cursor), int(keys), float(seconds), bool(finished))
        state.total = None if total is None else int(total)
        return state, TictacTree.from_bytes(bytes(tree))

    def drop_scans(self, group: str) -> None:
        self.store.execute(
            "DELETE FROM repair_scan_state WHERE run_id = ? AND group_name = ?",
            (self.run_id, group),
        )
        self.store.reclaim()

    # --- groups and keys ----------------------------------------------------

    def group_phase(self, group: str) -> tuple[str, dict[str, Any]] | None:
        rows = self.store.execute(
            "SELECT phase, stats_json FROM repair_groups WHERE run_id = ? AND group_name = ?",
            (self.run_id, group),
        )
        return (str(rows[0][0]), dict(json.loads(rows[0][1]))) if rows else None

    def set_group_phase(self, group: str, phase: str, stats: dict[str, Any]) -> None:
        self.store.execute(
            "INSERT OR REPLACE INTO repair_groups VALUES (?, ?, ?, ?)",
            (self.run_id, group, phase, json.dumps(stats)),
        )

    def add_keys(self, group: str, rows: Iterable[tuple[bytes, str, str, dict[str, Any]]]) -> None:
        """(key, kind, status, detail) rows, atomically."""
        self.store.transaction(
            (
                "INSERT OR REPLACE INTO repair_keys VALUES (?, ?, ?, ?, ?, ?)",
                (self.run_id, group, key, kind, status, json.dumps(detail)),
            )
            for key, kind, status, detail in rows
        )

    def keys(
        self, group: str, *, status: str | None = None
    ) -> list[tuple[bytes, str, str, dict[str, Any]]]:
        sql = (
            "SELECT key, kind, status, detail_json FROM repair_keys "
            "WHERE run_id = ? AND group_name = ?"
        )
        params: list[Any] = [self.run_id, group]
        if status is not None:
            sql += " AND status = ?"
            params.append(status)
        return [
            (bytes(k), str(kind), str(st), dict(json.loads(d)))
            for k, kind, st, d in self.store.execute(sql + " ORDER BY key", params)
        ]


def _run_dict(row: tuple[Any, ...], *, full: bool) -> dict[str, Any]:
    run_id, kind, status, started, finished, params, report, error = row
    out: dict[str, Any] = {
        "run_id": run_id,
        "kind": kind,
        "status": status,
        "started": started / 1e9,
        "finished": finished / 1e9 if finished else None,
        "params": json.loads(params),
        "error": error,
    }
    summary = json.loads(report) if report else None
    if summary is not None and not full:
        summary.pop("divergent_keys", None)
        summary.pop("replicas", None)
    out["report"] = summary
    return out


def list_runs(store: Store, *, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
    """Runs, newest first (reports without their key lists), JSON-safe; `offset` pages."""
    store.ensure_schema(SCHEMA)
    rows = store.execute(
        "SELECT run_id, kind, status, started_ns, finished_ns, params_json, report_json, error "
        "FROM repair_runs ORDER BY started_ns DESC, run_id DESC LIMIT ? OFFSET ?",
        (max(0, limit), max(0, offset)),
    )
    return [_run_dict(r, full=False) for r in rows]


def count_runs(store: Store) -> int:
    store.ensure_schema(SCHEMA)
    return int(store.execute("SELECT COUNT(*) FROM repair_runs")[0][0])


def get_run(store: Store, run_id: str) -> dict[str, Any] | None:
    """One run with its full report, or None."""
    store.ensure_schema(SCHEMA)
    rows = store.execute(
        "SELECT run_id, kind, status, started_ns, finished_ns, params_json, report_json, error "
        "FROM repair_runs WHERE run_id = ?",
        (run_id,),
    )
    return _run_dict(rows[0], full=True) if rows else None
