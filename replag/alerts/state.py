"""Alert states persisted in the store: pending → firing → resolved, with dedup and repeats.

One row per fingerprint (rule + subject labels), so a restarted service or the
next cron run carries on where the last evaluation stopped: an alert already
firing is not sent again before the repeat interval, and one that clears is
resolved exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from replag.alerts.rules import Condition
from replag.store import Store

Status = Literal["pending", "firing", "resolved"]

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS alert_state (
        fingerprint TEXT PRIMARY KEY,
        rule TEXT NOT NULL,
        labels_json TEXT NOT NULL,
        status TEXT NOT NULL,
        value REAL,
        summary TEXT NOT NULL,
        active_since_ns INTEGER NOT NULL,
        fired_ns INTEGER,
        resolved_ns INTEGER,
        last_notified_ns INTEGER,
        updated_ns INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS alert_events (
        id INTEGER PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        rule TEXT NOT NULL,
        labels_json TEXT NOT NULL,
        status TEXT NOT NULL,
        at_ns INTEGER NOT NULL,
        value REAL,
        summary TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS alert_events_at ON alert_events (at_ns)",
)
_COLUMNS = (
    "fingerprint",
    "rule",
    "labels_json",
    "status",
    "value",
    "summary",
    "active_since_ns",
    "fired_ns",
    "resolved_ns",
    "last_notified_ns",
    "updated_ns",
)


@dataclass(frozen=True, kw_only=True)
class AlertEvent:
    """One alert to notify: it started firing, is still firing (a repeat), or resolved."""

    fingerprint: str
    rule: str
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    value: float | None
    summary: str
    starts_ns: int
    ends_ns: int | None = None
    repeat: bool = False

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "warning")

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "rule": self.rule,
            "status": self.status,
            "labels": self.labels,
            "value": self.value,
            "summary": self.summary,
            "starts_ns": self.starts_ns,
            "ends_ns": self.ends_ns,
            "repeat": self.repeat,
        }


class AlertBook:
    """The alert_state and alert_events tables, and the transitions between states."""

    def __init__(self, store: Store) -> None:
        self.store = store
        store.ensure_schema(SCHEMA)

    def apply(
        self,
        conditions: Sequence[Condition],
        *,
        now_ns: int,
        repeat_interval_s: float,
        send_resolved: bool = True,
    ) -> list[AlertEvent]:
        """Move each alert along its state machine; return what must be notified.

        An alert with no active condition now (its subject recovered, went away, or its
        rule was removed from the config) is cleared if pending and resolved if firing.
        """
        current = {row["fingerprint"]: row for row in self._rows("status != 'resolved'")}
        active = {c.fingerprint: c for c in conditions if c.active}
        events: list[AlertEvent] = []
        writes: list[tuple[str, Sequence[Any]]] = []
        for fp, cond in active.items():
            row = current.get(fp)
            labels = cond.all_labels
            if row is None:
                row = {
                    "fingerprint": fp,
                    "rule": cond.rule.name,
                    "status": "pending",
                    "active_since_ns": now_ns,
                    "fired_ns": None,
                    "resolved_ns": None,
                    "last_notified_ns": None,
                }
                writes.append(self._event(fp, cond.rule.name, labels, "pending", now_ns, cond))
            row.update(
                labels_json=json.dumps(labels),
                value=cond.value,
                summary=cond.summary,
                updated_ns=now_ns,
            )
            due_ns = row["active_since_ns"] + int(cond.rule.for_s * 1e9)
            if row["status"] == "pending" and now_ns >= due_ns:
                row.update(status="firing", fired_ns=now_ns, last_notified_ns=now_ns)
                writes.append(self._event(fp, cond.rule.name, labels, "firing", now_ns, cond))
                events.append(_event(row, labels, repeat=False))
            elif row["status"] == "firing" and (
                now_ns - (row["last_notified_ns"] or 0) >= repeat_interval_s * 1e9
            ):
                row["last_notified_ns"] = now_ns
                events.append(_event(row, labels, repeat=True))
            writes.append(self._upsert(row))
        for fp, row in current.items():
            if fp in active:
                continue
            labels = json.loads(row["labels_json"])
            if row["status"] == "pending":
                writes.append(("DELETE FROM alert_state WHERE fingerprint = ?", (fp,)))
                writes.append(self._event(fp, row["rule"], labels, "cleared", now_ns, None))
                continue
            row.update(status="resolved", resolved_ns=now_ns, updated_ns=now_ns)
            writes.append(self._upsert(row))
            writes.append(self._event(fp, row["rule"], labels, "resolved", now_ns, None))
            if send_resolved:
                events.append(_event(row, labels, repeat=False))
        self.store.transaction(writes)
        return events

    def active(self) -> list[dict[str, Any]]:
        return [_public(r) for r in self._rows("status != 'resolved'")]

    def history(self, *, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.store.execute(
            """SELECT fingerprint, rule, labels_json, status, at_ns, value, summary
               FROM alert_events ORDER BY at_ns DESC, id DESC LIMIT ?""",
            (limit,),
        )
        return [
            {
                "fingerprint": r[0],
                "rule": r[1],
                "labels": json.loads(r[2]),
                "status": r[3],
                "at_ns": r[4],
                "value": r[5],
                "summary": r[6],
            }
            for r in rows
        ]

    def prune_events(self, before_ns: int) -> int:
        """Delete state changes older than `before_ns` (UTC epoch ns); return how many.

        Current states stay: an alert firing since before the cutoff keeps its row.
        """
        query = "FROM alert_events WHERE at_ns < ?"
        count = int(self.store.execute(f"SELECT COUNT(*) {query}", (before_ns,))[0][0])
        if count:
            self.store.execute(f"DELETE {query}", (before_ns,))
        return count

    def firing_count(self) -> int:
        return int(
            self.store.execute("SELECT COUNT(*) FROM alert_state WHERE status = 'firing'")[0][0]
        )

    def _rows(self, where: str) -> list[dict[str, Any]]:
        rows = self.store.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM alert_state WHERE {where} ORDER BY active_since_ns"
        )
        return [dict(zip(_COLUMNS, r, strict=True)) for r in rows]

    @staticmethod
    def _upsert(row: dict[str, Any]) -> tuple[str, Sequence[Any]]:
        return (
            f"INSERT OR REPLACE INTO alert_state ({', '.join(_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(_COLUMNS))})",
            tuple(row[c] for c in _COLUMNS),
        )

    @staticmethod
    def _event(
        fp: str,
        rule: str,
        labels: dict[str, str],
        status: str,
        at_ns: int,
        cond: Condition | None,
    ) -> tuple[str, Sequence[Any]]:
        return (
            """INSERT INTO alert_events (fingerprint, rule, labels_json, status, at_ns, value,
               summary) VALUES (?, ?, ?, ?, ?, ?, ?)""",
            (
                fp,
                rule,
                json.dumps(labels),
                status,
                at_ns,
                cond.value if cond else None,
                cond.summary if cond else "",
            ),
        )


def _event(row: dict[str, Any], labels: dict[str, str], *, repeat: bool) -> AlertEvent:
    resolved = row["status"] == "resolved"
    return AlertEvent(
        fingerprint=row["fingerprint"],
        rule=row["rule"],
        status="resolved" if resolved else "firing",
        labels=labels,
        value=row["value"],
        summary=row["summary"],
        starts_ns=row["fired_ns"] or row["active_since_ns"],
        ends_ns=row["resolved_ns"] if resolved else None,
        repeat=repeat,
    )


def _public(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "fingerprint": row["fingerprint"],
        "rule": row["rule"],
        "labels": json.loads(row["labels_json"]),
        "status": row["status"],
        "value": row["value"],
        "summary": row["summary"],
        "active_since_ns": row["active_since_ns"],
        "fired_ns": row["fired_ns"],
        "last_notified_ns": row["last_notified_ns"],
    }
