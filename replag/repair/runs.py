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

from replag.repair.scan.scanner import ScanProgress
from replag.repair.trees.tictac import TictacTree
from replag.store import Row, Store
from replag.store.leases import instance_id

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
        self.store = store
        self.run_id = run_id

    @classmethod
    def create(cls, store: Store, *, kind: str, params: dict[str, Any]) -> RunLog:
        log = cls(store, new_run_id(kind))
        store.execute(
            "INSERT INTO repair_runs (run_id, kind, status, started_ns, params_json, owner, "
            f"heartbeat_ns) VALUES (?, ?, ?, ?, ?, ?, {store.now_ns_sql})",
            (log.run_id, kind, RUNNING, time.time_ns(), json.dumps(params), instance_id()),
        )
        return log

    def row(self) -> tuple[str, str, dict[str, Any]] | None:
        """(kind, status, params) of this run, None if it does not exist."""
        rows = self.store.execute(
            "SELECT kind, status, params_json FROM repair_runs WHERE run_id = ?", (self.run_id,)
        )
        if not rows:
            return None
        row = rows[0]
        return str(row.kind), str(row.status), dict(json.loads(row.params_json))

    def heartbeat(self) -> None:
        """Say this instance still runs the run (and now owns it, after a resume)."""
        self.store.execute(
            f"UPDATE repair_runs SET owner = ?, heartbeat_ns = {self.store.now_ns_sql} "
            "WHERE run_id = ?",
            (instance_id(), self.run_id),
        )

    def set_status(
        self, status: str, *, report: dict[str, Any] | None = None, error: str | None = None
    ) -> None:
        finished = time.time_ns() if status != RUNNING else None
        self.store.execute(
            "UPDATE repair_runs SET status = ?, finished_ns = ?, "
            "report_json = COALESCE(?, report_json), error = ?, owner = ?, "
            f"heartbeat_ns = {self.store.now_ns_sql} WHERE run_id = ?",
            (
                status,
                finished,
                json.dumps(report) if report is not None else None,
                error,
                instance_id(),
                self.run_id,
            ),
        )

    # --- scan checkpoints ---------------------------------------------------

    def save_scan(self, group: str, state: ScanProgress, tree: TictacTree) -> None:
        """Where `state.replica`'s scan stands and the tree of the keys before it."""
        self.store.execute(
            """INSERT INTO repair_scan_state (run_id, group_name, replica, cursor, keys,
                   seconds, finished, total, tree) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (run_id, group_name, replica) DO UPDATE SET
                   cursor = excluded.cursor, keys = excluded.keys, seconds = excluded.seconds,
                   finished = excluded.finished, total = excluded.total, tree = excluded.tree""",
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
        row = rows[0]
        state = ScanProgress(
            replica, bytes(row.cursor), int(row.keys), float(row.seconds), bool(row.finished)
        )
        state.total = None if row.total is None else int(row.total)
        return state, TictacTree.from_bytes(bytes(row.tree))

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
        return (str(rows[0].phase), dict(json.loads(rows[0].stats_json))) if rows else None

    def set_group_phase(self, group: str, phase: str, stats: dict[str, Any]) -> None:
        self.store.execute(
            """INSERT INTO repair_groups (run_id, group_name, phase, stats_json)
               VALUES (?, ?, ?, ?) ON CONFLICT (run_id, group_name) DO UPDATE SET
                   phase = excluded.phase, stats_json = excluded.stats_json""",
            (self.run_id, group, phase, json.dumps(stats)),
        )

    def add_keys(self, group: str, rows: Iterable[tuple[bytes, str, str, dict[str, Any]]]) -> None:
        """(key, kind, status, detail) rows, atomically."""
        self.store.transaction(
            (
                """INSERT INTO repair_keys (run_id, group_name, key, kind, status, detail_json)
                   VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, group_name, key) DO UPDATE
                   SET kind = excluded.kind, status = excluded.status,
                       detail_json = excluded.detail_json""",
                (self.run_id, group, key, kind, status, json.dumps(detail)),
            )
            for key, kind, status, detail in rows
        )

    def drop_keys(self, group: str, keys: Iterable[bytes]) -> None:
        """Forget keys found before it was known they could not be compared."""
        self.store.transaction(
            (
                "DELETE FROM repair_keys WHERE run_id = ? AND group_name = ? AND key = ?",
                (self.run_id, group, key),
            )
            for key in keys
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
            (bytes(r.key), str(r.kind), str(r.status), dict(json.loads(r.detail_json)))
            for r in self.store.execute(sql + " ORDER BY key", params)
        ]


# Heartbeats come with every checkpoint and status change, and at least every
# HEARTBEAT_S from a running run (see `replag.repair.engine`): a `running` run whose
# heartbeat is older than OWNER_DEAD_AFTER_S has lost its owner.
HEARTBEAT_S = 10.0
OWNER_DEAD_AFTER_S = 60.0
_RUN_COLUMNS = (
    "run_id, kind, status, started_ns, finished_ns, params_json, report_json, error, "
    "owner, heartbeat_ns"
)


def _run_dict(row: Row, *, full: bool, now_ns: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "run_id": row.run_id,
        "kind": row.kind,
        "status": row.status,
        "started": row.started_ns / 1e9,
        "finished": row.finished_ns / 1e9 if row.finished_ns else None,
        "params": json.loads(row.params_json),
        "error": row.error,
        "owner": row.owner,
        "heartbeat": row.heartbeat_ns / 1e9 if row.heartbeat_ns else None,
        "owner_alive": None,
    }
    if row.status == RUNNING:
        beat = row.heartbeat_ns or row.started_ns
        alive = now_ns - beat < OWNER_DEAD_AFTER_S * 1e9
        out["owner_alive"] = alive
        if not alive:
            who = row.owner or "its process"
            out["error"] = out["error"] or (
                f"owner {who} died: no heartbeat for {(now_ns - beat) / 1e9:.0f} s; "
                f"resume it with `{resume_command(row.kind, row.run_id)}`"
            )
    summary = json.loads(row.report_json) if row.report_json else None
    if summary is not None and not full:
        summary.pop("divergent_keys", None)
        summary.pop("replicas", None)
    out["report"] = summary
    return out


def _now_ns(store: Store) -> int:
    return int(store.execute(f"SELECT {store.now_ns_sql} AS now_ns")[0].now_ns)


def list_runs(store: Store, *, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
    """Runs, newest first (reports without their key lists), JSON-safe; `offset` pages.
    A run still `running` whose owner stopped its heartbeat says so (`owner_alive`)."""
    rows = store.execute(
        f"SELECT {_RUN_COLUMNS} FROM repair_runs "
        "ORDER BY started_ns DESC, run_id DESC LIMIT ? OFFSET ?",
        (max(0, limit), max(0, offset)),
    )
    now = _now_ns(store)
    return [_run_dict(r, full=False, now_ns=now) for r in rows]


def count_runs(store: Store) -> int:
    return int(store.execute("SELECT COUNT(*) AS n FROM repair_runs")[0].n)


def get_run(store: Store, run_id: str) -> dict[str, Any] | None:
    """One run with its full report, or None."""
    rows = store.execute(f"SELECT {_RUN_COLUMNS} FROM repair_runs WHERE run_id = ?", (run_id,))
    return _run_dict(rows[0], full=True, now_ns=_now_ns(store)) if rows else None
