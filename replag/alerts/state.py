"""Alert states persisted in the store: pending → firing → resolved, no data, dedup, repeats.

One row per fingerprint (rule + subject labels), so a restarted service or the
next cron run carries on where the last evaluation stopped: an alert already
firing is not sent again before the repeat interval, and one that clears is
resolved exactly once, with the value that resolved it and how long it fired.

A condition with no data (a partitioned replica has no p99) is handled by its
rule's `no_data`:

* `keep_firing` (default): the alert stays as it is. A firing alert keeps
  firing (and repeating) with "no data since …" in its summary; a pending one
  waits; nothing new starts. A partition never resolves an alert.
* `nodata`: the alert moves to the `nodata` state, notified like a firing
  alert (Alertmanager's status "firing", annotation `state: nodata`, Slack
  "[NO DATA]"), and resolved once data shows the condition clear.
* `ok`: no data counts as healthy: the alert resolves (clears if pending).

Every change of state is logged.

Several service instances may evaluate against one store: each change is a
compare-and-set on the row's `updated_ns` as it was read, and every
notification it decides is an `alert_outbox` row written in the same
transaction. An evaluation that lost a race (a row changed since it read it)
writes nothing and notifies nothing; the next one starts from the new state.
So a change is decided, and its notification queued, exactly once.

An outbox row is *claimed* by the instance sending it until `claimed_until_ns`
(database clock): at its decision, and again right before each request, under
the lease (`claim_outbox`). Another owner adopts an undelivered row only once
its claim ran out (`adopt_outbox`), and a sender whose row was adopted meanwhile
does not send it; so an owner handing the lease over while it is still sending
does not make the next one send the same notification too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from replag.alerts.rules import Condition
from replag.durations import format_span
from replag.errors import StoreUnwritable
from replag.store import Store, Transaction

log = logging.getLogger(__name__)

Status = Literal["pending", "firing", "nodata", "resolved"]

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
    "nodata_since_ns",
)

# Written later (held while the store could not take it): the newer decision wins, so a
# state decided by an instance cut off from the store never overwrites a later one made
# meanwhile by the evaluator that took over.
_UPSERT_STATE = (
    f"INSERT INTO alert_state ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))}) "
    "ON CONFLICT (fingerprint) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS if c != "fingerprint")
    + " WHERE alert_state.updated_ns <= excluded.updated_ns"
)
_INSERT_STATE = (
    f"INSERT INTO alert_state ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))}) "
    "ON CONFLICT (fingerprint) DO NOTHING"
)
# Compare-and-set: only where the row is still as this evaluation read it.
_UPDATE_STATE = (
    "UPDATE alert_state SET "
    + ", ".join(f"{c} = ?" for c in _COLUMNS if c != "fingerprint")
    + " WHERE fingerprint = ? AND updated_ns = ?"
)


class AlertStateMoved(Exception):
    """Another evaluation changed an alert's state since this one read it."""


@dataclass(frozen=True, kw_only=True)
class AlertEvent:
    """One alert to notify: it fires, is still firing (a repeat), has no data, or resolved.

    `starts_ns` is when it started firing (or went without data); a resolved event's
    `ends_ns` is when it resolved, and its `value` and `summary` are what resolved it.
    """

    fingerprint: str
    rule: str
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    value: float | None
    summary: str
    starts_ns: int
    ends_ns: int | None = None
    repeat: bool = False
    nodata: bool = False
    # When the evaluation that decided it ran (its outbox row's created_ns).
    decided_ns: int = 0

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "warning")

    @property
    def state(self) -> Literal["firing", "nodata", "resolved"]:
        """firing, nodata or resolved: what a human is told."""
        return "nodata" if self.nodata and self.status == "firing" else self.status

    @property
    def notification_id(self) -> str:
        """The same for every copy of this notification (a re-send by the next owner after
        a failover): the alert's fingerprint and when the notification was decided. A
        repeat of a firing alert is a notification of its own, with an id of its own."""
        return f"{self.fingerprint}:{self.decided_ns}"

    @property
    def duration_s(self) -> float | None:
        """How long a resolved alert was firing (or without data)."""
        return None if self.ends_ns is None else (self.ends_ns - self.starts_ns) / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "rule": self.rule,
            "status": self.status,
            "state": self.state,
            "labels": self.labels,
            "value": self.value,
            "summary": self.summary,
            "starts_ns": self.starts_ns,
            "ends_ns": self.ends_ns,
            "duration_s": self.duration_s,
            "repeat": self.repeat,
        }


class AlertBook:
    """The alert_state and alert_events tables, and the transitions between states."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def apply(
        self,
        conditions: Sequence[Condition],
        *,
        now_ns: int,
        repeat_interval_s: float,
        send_resolved: bool = True,
        guard: Callable[[Transaction], None] | None = None,
        epoch: int = 0,
        unknown_rules: frozenset[str] | set[str] = frozenset(),
        keep: Callable[[dict[str, Any]], bool] | None = None,
        claim_s: float = 0.0,
    ) -> list[AlertEvent]:
        """Move each alert along its state machine; return what must be notified.

        An alert whose condition is inactive now, or that has no condition at all (its
        subject went away, or its rule was removed from the config), is cleared if
        pending and resolved if firing or without data. No data follows the rule's
        `no_data` (see the module docstring); an alert of one of `unknown_rules` (rules
        that could not be evaluated: the store is away), or for whose row `keep` says so,
        stays as it is. `guard` runs first
        in the transaction
        (the service's lease check: LeaseLost rolls it back); `epoch` is the lease's,
        recorded on the outbox rows, which its sender claims for `claim_s` from when
        they are stored (see `claim_outbox`). Returns no events when another evaluation
        moved a state meanwhile (nothing written).
        """
        try:
            read_ns = {
                r.fingerprint: r.updated_ns
                for r in self.store.execute(
                    "SELECT fingerprint, updated_ns FROM alert_state", last_known=True
                )
            }
        except StoreUnwritable:
            read_ns = {}  # the store is away: the changes are plain writes, held (below)
        step = _Step(
            current={row["fingerprint"]: row for row in self._unresolved()},
            now_ns=now_ns,
            repeat_ns=int(repeat_interval_s * 1e9),
            send_resolved=send_resolved,
            read_ns=read_ns,
        )
        seen: set[str] = set()
        for cond in conditions:
            if cond.fingerprint in seen:
                continue
            seen.add(cond.fingerprint)
            if cond.active:
                step.active(cond)
            elif cond.no_data and cond.rule.no_data == "keep_firing":
                step.keep(cond)
            elif cond.no_data and cond.rule.no_data == "nodata":
                step.nodata(cond)
            else:
                step.inactive(cond.fingerprint, cond)
        for fp in step.current.keys() - seen:
            stored = step.current[fp]
            if stored["rule"] not in unknown_rules and (keep is None or not keep(stored)):
                step.inactive(fp, None)
        events = [dataclasses.replace(e, decided_ns=now_ns) for e in step.events]
        outbox = [
            (
                # Claimed from when it is stored (a held row: from when it is written back).
                f"""INSERT INTO alert_outbox
                    (fingerprint, event_json, created_ns, epoch, claimed_until_ns)
                    VALUES (?, ?, ?, ?, {self.store.now_ns_sql} + ?)""",
                (e.fingerprint, json.dumps(_outbox_dict(e)), now_ns, epoch, _ns(claim_s)),
            )
            for e in events
        ]
        try:
            with self.store.begin() as tx:
                if guard is not None:
                    guard(tx)
                for sql, params, must_change in step.writes:
                    changed = tx.execute(sql, params).rowcount
                    if must_change and changed == 0:
                        raise AlertStateMoved(sql)
                for sql, params in outbox:
                    tx.execute(sql, params)
        except AlertStateMoved:
            log.info("alert states moved by another evaluation meanwhile: decided there")
            return []
        except StoreUnwritable:
            # The store cannot take writes now: alerting goes on. The new states are
            # written (plain upserts) when it can, and remembered meanwhile, so the next
            # evaluation carries on from them (not from the stored ones).
            plain = [*step.plain_writes(), *outbox]
            if not self.store.transaction(plain):
                for fp, row in step.changed.items():
                    self.store.remember("alert_state", fp, row)
        return events

    def pending_outbox(self, *, through_epoch: int) -> list[tuple[int, AlertEvent]]:
        """Notifications decided under `through_epoch` or before, not delivered, and whose
        claim ran out (their sender died, lost its lease, or was stopped by its fence):
        (outbox id, event)."""
        now = self.store.now_ns_sql
        rows = self.store.execute(
            f"""SELECT id, event_json FROM alert_outbox
                WHERE delivered_ns IS NULL AND epoch <= ?
                AND (claimed_until_ns IS NULL OR claimed_until_ns <= {now}) ORDER BY id""",
            (through_epoch,),
        )
        return [(int(r.id), event_from_dict(json.loads(r.event_json))) for r in rows]

    def adopt_outbox(
        self,
        ids: Sequence[int],
        *,
        epoch: int,
        claim_s: float = 0.0,
        guard: Callable[[Transaction], None] | None = None,
    ) -> list[int]:
        """Make the rows `ids` this owner's (its `epoch`, claimed for `claim_s`) where they
        are still undelivered and unclaimed; return those adopted. `guard` (the lease
        check) runs first in the transaction."""
        now = self.store.now_ns_sql
        adopted = []
        with self.store.begin() as tx:
            if guard is not None:
                guard(tx)
            for i in ids:
                changed = tx.execute(
                    f"""UPDATE alert_outbox SET epoch = ?, claimed_until_ns = {now} + ?
                        WHERE id = ? AND delivered_ns IS NULL
                        AND (claimed_until_ns IS NULL OR claimed_until_ns <= {now})""",
                    (epoch, _ns(claim_s), i),
                ).rowcount
                if changed:
                    adopted.append(i)
        return adopted

    def claim_outbox(
        self,
        events: Sequence[AlertEvent],
        *,
        epoch: int,
        claim_s: float,
        guard: Callable[[Transaction], None] | None = None,
    ) -> list[AlertEvent]:
        """Right before sending `events`: claim their rows for `claim_s` more, where they
        are still undelivered and at `epoch` (the sender's: not adopted by another owner
        meanwhile); return the events this sender may send. An event whose row is not
        stored yet (held in this process while the store could not take it) is this
        sender's too. `guard` (the lease check) runs first: LeaseLost rolls it back, so
        no owner can take the lease, and adopt, between this check and the claim."""
        now = self.store.now_ns_sql
        claim_ns = _ns(claim_s)
        mine = []
        with self.store.begin() as tx:
            if guard is not None:
                guard(tx)
            for e in events:
                changed = tx.execute(
                    f"""UPDATE alert_outbox SET claimed_until_ns = CASE
                            WHEN claimed_until_ns > {now} + ? THEN claimed_until_ns
                            ELSE {now} + ? END
                        WHERE fingerprint = ? AND created_ns = ? AND epoch = ?
                        AND delivered_ns IS NULL""",
                    (claim_ns, claim_ns, e.fingerprint, e.decided_ns, epoch),
                ).rowcount
                if changed or not tx.execute(
                    "SELECT id FROM alert_outbox WHERE fingerprint = ? AND created_ns = ?",
                    (e.fingerprint, e.decided_ns),
                ):
                    mine.append(e)
        return mine

    def mark_delivered(self, events: Sequence[AlertEvent], *, now_ns: int) -> bool:
        """The outbox rows of `events` were sent to every sink (or given up on). False when
        the mark may not have reached their rows: the store is not taking writes now (the
        mark, or the rows themselves, wait in memory, and a mark written before its row
        marks nothing), so mark them again once it does."""
        written = self.store.transaction(
            (
                """UPDATE alert_outbox SET delivered_ns = ?
                   WHERE fingerprint = ? AND created_ns = ? AND delivered_ns IS NULL""",
                (now_ns, e.fingerprint, e.decided_ns),
            )
            for e in events
        )
        return written and self.store.health.state == "ok"

    def active(self) -> list[dict[str, Any]]:
        return [_public(r) for r in self._unresolved()]

    def history(self, *, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.store.execute(
            """SELECT fingerprint, rule, labels_json, status, at_ns, value, summary
               FROM alert_events ORDER BY at_ns DESC, id DESC LIMIT ?""",
            (limit,),
            last_known=True,
        )
        return [
            {
                "fingerprint": r.fingerprint,
                "rule": r.rule,
                "labels": json.loads(r.labels_json),
                "status": r.status,
                "at_ns": r.at_ns,
                "value": r.value,
                "summary": r.summary,
            }
            for r in rows
        ]

    def prune_events(self, before_ns: int) -> int:
        """Delete state changes older than `before_ns` (UTC epoch ns); return how many.

        Current states stay: an alert firing since before the cutoff keeps its row.
        """
        gone = self.store.execute("DELETE FROM alert_events WHERE at_ns < ?", (before_ns,))
        return max(0, gone.rowcount)

    def firing_events(self) -> list[AlertEvent]:
        """Every alert firing (or without data) now, as a repeat of its notification:
        what an Alertmanager is told again while it lasts."""
        return [
            _event(row, repeat=True)
            for row in self._unresolved()
            if row["status"] in ("firing", "nodata")
        ]

    def firing_count(self) -> int:
        if self.store.remembered("alert_state"):
            return sum(r["status"] == "firing" for r in self._unresolved())
        rows = self.store.execute(
            "SELECT COUNT(*) AS n FROM alert_state WHERE status = 'firing'", last_known=True
        )
        return int(rows[0].n)

    def _unresolved(self) -> list[dict[str, Any]]:
        """Alerts not resolved, oldest first: as stored, and as changed since if the store
        could not take those changes yet."""
        rows = self.store.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM alert_state WHERE status != 'resolved' "
            "ORDER BY active_since_ns",
            last_known=True,
        )
        current = {r.fingerprint: r.asdict() for r in rows}
        for fp, row in self.store.remembered("alert_state").items():
            if row is None or row["status"] == "resolved":
                current.pop(str(fp), None)
            else:
                current[str(fp)] = dict(row)
        return sorted(current.values(), key=lambda r: int(r["active_since_ns"]))


class _Step:
    """One evaluation's transitions: rows to write, events to send, lines to log."""

    def __init__(
        self,
        *,
        current: dict[str, dict[str, Any]],
        now_ns: int,
        repeat_ns: int,
        send_resolved: bool,
        read_ns: dict[str, int],
    ) -> None:
        self.current = current
        self.now_ns = now_ns
        self.repeat_ns = repeat_ns
        self.send_resolved = send_resolved
        # (statement, parameters, must change a row: a compare-and-set)
        self.writes: list[tuple[str, Sequence[Any], bool]] = []
        self.changed: dict[str, dict[str, Any] | None] = {}  # fingerprint → new row, or deleted
        self.events: list[AlertEvent] = []
        self.read_ns = read_ns

    def active(self, cond: Condition) -> None:
        now, row = self.now_ns, self.current.get(cond.fingerprint)
        if row is None:
            row = self._new_row(cond, "pending")
            self._log(logging.INFO, cond.rule.name, "pending", cond.summary)
        previous = row["status"]
        if row["nodata_since_ns"] is not None and previous != "nodata":
            self._log(logging.INFO, cond.rule.name, f"{previous}, data again", cond.summary)
        row.update(value=cond.value, summary=cond.summary, nodata_since_ns=None)
        due_ns = row["active_since_ns"] + int(cond.rule.for_s * 1e9)
        if (previous == "pending" and now >= due_ns) or previous == "nodata":
            # Out of no data with the condition true: firing again (since when it first fired).
            row.update(status="firing", fired_ns=row["fired_ns"] or now, last_notified_ns=now)
            self._record(row, "firing", cond)
            self._log(logging.WARNING, cond.rule.name, "firing", cond.summary)
            self.events.append(_event(row, repeat=False))
        elif previous == "firing" and now - (row["last_notified_ns"] or 0) >= self.repeat_ns:
            row["last_notified_ns"] = now
            self.events.append(_event(row, repeat=True))
        self._upsert(row)

    def keep(self, cond: Condition) -> None:
        """No data, rule says keep_firing: the alert stays as it is, saying since when."""
        row = self.current.get(cond.fingerprint)
        if row is None:
            return
        if row["nodata_since_ns"] is None:
            row["nodata_since_ns"] = self.now_ns
            self._log(
                logging.WARNING, cond.rule.name, f"{row['status']}, kept (no data)", cond.summary
            )
        since = _clock(row["nodata_since_ns"])
        row.update(summary=f"{cond.summary} (no data since {since}; {row['status']} kept)")
        if cond.value is not None:
            row["value"] = cond.value
        if row["status"] == "firing" and self.now_ns - (row["last_notified_ns"] or 0) >= (
            self.repeat_ns
        ):
            row["last_notified_ns"] = self.now_ns
            self.events.append(_event(row, repeat=True))
        self._upsert(row)

    def nodata(self, cond: Condition) -> None:
        """No data, rule says nodata: the alert goes to (or stays in) the nodata state."""
        now = self.now_ns
        row = self.current.get(cond.fingerprint) or self._new_row(cond, "nodata")
        entering = row["status"] != "nodata" or row["nodata_since_ns"] is None
        row["summary"] = f"no data: {cond.summary}"
        if cond.value is not None:
            row["value"] = cond.value
        if entering:
            row.update(status="nodata", nodata_since_ns=now, last_notified_ns=now)
            self._record(row, "nodata", cond)
            self._log(logging.WARNING, cond.rule.name, "no data", cond.summary)
            self.events.append(_event(row, repeat=False))
        elif now - (row["last_notified_ns"] or 0) >= self.repeat_ns:
            row["last_notified_ns"] = now
            self.events.append(_event(row, repeat=True))
        self._upsert(row)

    def inactive(self, fp: str, cond: Condition | None) -> None:
        row = self.current.get(fp)
        if row is None:
            return
        now = self.now_ns
        what = (
            cond.summary
            if cond is not None
            else "no longer evaluated (its subject or rule left the config)"
        )
        if row["status"] == "pending":
            self.changed[fp] = None
            self.writes.append(
                (
                    "DELETE FROM alert_state WHERE fingerprint = ? AND updated_ns = ?",
                    (fp, self.read_ns[fp]),
                    True,
                )
            )
            self._record(row, "cleared", cond)
            self._log(logging.INFO, row["rule"], "cleared before firing", what)
            return
        started = _started_ns(row)
        how = "firing" if row["fired_ns"] is not None else "no data"
        summary = (
            f"resolved after {format_span((now - started) / 1e9)} of {how} "
            f"(since {_clock(started)}): {what}"
        )
        row.update(
            status="resolved",
            resolved_ns=now,
            updated_ns=now,
            summary=summary,
            value=cond.value if cond is not None else None,
        )
        self._upsert(row)
        self._record(row, "resolved", cond)
        self._log(logging.INFO, row["rule"], "resolved", summary)
        if self.send_resolved:
            self.events.append(_event(row, repeat=False))

    # --- helpers ---------------------------------------------------------------

    def _new_row(self, cond: Condition, status: Status) -> dict[str, Any]:
        row = {
            "fingerprint": cond.fingerprint,
            "rule": cond.rule.name,
            "labels_json": json.dumps(cond.all_labels),
            "status": status,
            "value": cond.value,
            "summary": cond.summary,
            "active_since_ns": self.now_ns,
            "fired_ns": None,
            "resolved_ns": None,
            "last_notified_ns": None,
            "updated_ns": self.now_ns,
            "nodata_since_ns": None,
        }
        if status == "pending":
            self._record(row, "pending", cond)
        self.current[cond.fingerprint] = row
        return row

    def _upsert(self, row: dict[str, Any]) -> None:
        row["updated_ns"] = self.now_ns
        self.changed[row["fingerprint"]] = dict(row)
        fp = row["fingerprint"]
        if fp in self.read_ns:
            values = tuple(row[c] for c in _COLUMNS if c != "fingerprint")
            self.writes.append((_UPDATE_STATE, (*values, fp, self.read_ns[fp]), True))
        else:
            self.writes.append((_INSERT_STATE, tuple(row[c] for c in _COLUMNS), True))

    def plain_writes(self) -> list[tuple[str, Sequence[Any]]]:
        """This step's writes without the compare-and-set (a store that cannot take
        writes now keeps them for later: there is no state to compare with meanwhile)."""
        out: list[tuple[str, Sequence[Any]]] = [
            (sql, params) for sql, params, must_change in self.writes if not must_change
        ]
        for fp, row in self.changed.items():
            if row is None:
                out.append(
                    (
                        "DELETE FROM alert_state WHERE fingerprint = ? AND updated_ns <= ?",
                        (fp, self.now_ns),
                    )
                )
            else:
                out.append((_UPSERT_STATE, tuple(row[c] for c in _COLUMNS)))
        return out

    def _record(self, row: dict[str, Any], status: str, cond: Condition | None) -> None:
        self.writes.append(
            (
                """INSERT INTO alert_events (fingerprint, rule, labels_json, status, at_ns,
                   value, summary) VALUES (?, ?, ?, ?, ?, ?, ?)""",
                (
                    row["fingerprint"],
                    row["rule"],
                    row["labels_json"],
                    status,
                    self.now_ns,
                    row["value"] if status == "resolved" else (cond.value if cond else None),
                    row["summary"] if status == "resolved" else (cond.summary if cond else ""),
                ),
                False,
            )
        )

    @staticmethod
    def _log(level: int, rule: str, what: str, summary: str) -> None:
        log.log(level, "alert %s %s: %s", rule, what, summary)


def _started_ns(row: dict[str, Any]) -> int:
    """When the alert started to matter: it fired, or (never fired) went without data."""
    return int(row["fired_ns"] or row["nodata_since_ns"] or row["active_since_ns"])


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _event(row: dict[str, Any], *, repeat: bool) -> AlertEvent:
    resolved = row["status"] == "resolved"
    return AlertEvent(
        fingerprint=row["fingerprint"],
        rule=row["rule"],
        status="resolved" if resolved else "firing",
        labels=json.loads(row["labels_json"]),
        value=row["value"],
        summary=row["summary"],
        starts_ns=_started_ns(row),
        ends_ns=row["resolved_ns"] if resolved else None,
        repeat=repeat,
        nodata=row["status"] == "nodata",
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
        "nodata_since_ns": row["nodata_since_ns"],
        "last_notified_ns": row["last_notified_ns"],
    }


def _outbox_dict(event: AlertEvent) -> dict[str, Any]:
    return {**event.to_dict(), "nodata": event.nodata, "decided_ns": event.decided_ns}


def event_from_dict(data: dict[str, Any]) -> AlertEvent:
    """An event as its outbox row keeps it."""
    return AlertEvent(
        fingerprint=data["fingerprint"],
        rule=data["rule"],
        status=data["status"],
        labels=dict(data["labels"]),
        value=data["value"],
        summary=data["summary"],
        starts_ns=int(data["starts_ns"]),
        ends_ns=data["ends_ns"],
        repeat=bool(data["repeat"]),
        nodata=bool(data["nodata"]),
        decided_ns=int(data["decided_ns"]),
    )
