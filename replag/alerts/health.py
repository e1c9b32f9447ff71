"""The latest outcome of each source's probe and each group's repair check, kept in the store.

Alert rules (unreachable replicas, divergent keys, no successful probe) read
these rows, so a rule evaluated by `replag probe --alerts` from cron sees what
the service recorded and the other way round.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from replag.store import Store


@dataclass(frozen=True, kw_only=True)
class ProbeHealth:
    source: str
    last_attempt_ns: int
    last_success_ns: int | None
    last_run_id: str | None
    unreachable: list[dict[str, str]]
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "last_attempt_ns": self.last_attempt_ns,
            "last_success_ns": self.last_success_ns,
            "last_run_id": self.last_run_id,
            "unreachable": self.unreachable,
            "error": self.error,
        }


@dataclass(frozen=True, kw_only=True)
class GroupHealth:
    """A group's latest check: `divergent` and `run_id` are from the last successful one,
    `error` (None when the latest succeeded) and `checked_ns` from the latest."""

    group: str
    checked_ns: int
    divergent: int | None
    run_id: str | None
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "checked_ns": self.checked_ns,
            "divergent": self.divergent,
            "run_id": self.run_id,
            "error": self.error,
        }


def record_probe(
    store: Store,
    *,
    source: str,
    run_id: str | None,
    unreachable: list[dict[str, str]],
    error: str | None,
    at_ns: int | None = None,
) -> None:
    """Remember a probe attempt; `error` set means the run failed (nothing was measured)."""
    now = at_ns or time.time_ns()
    written = store.execute(
        """INSERT INTO probe_health (source, last_attempt_ns, last_success_ns, last_run_id,
               unreachable_json, error) VALUES (?, ?, ?, ?, ?, ?)
           ON CONFLICT (source) DO UPDATE SET last_attempt_ns = excluded.last_attempt_ns,
               last_success_ns = COALESCE(excluded.last_success_ns, probe_health.last_success_ns),
               last_run_id = COALESCE(excluded.last_run_id, probe_health.last_run_id),
               unreachable_json = excluded.unreachable_json, error = excluded.error""",
        (source, now, None if error else now, run_id, json.dumps(unreachable), error),
    )
    if written.deferred:
        # The store cannot take it now: rules and health read this until it can.
        before = probe_health(store).get(source)
        store.remember(
            "probe_health",
            source,
            ProbeHealth(
                source=source,
                last_attempt_ns=now,
                last_success_ns=now
                if error is None
                else (before.last_success_ns if before else None),
                last_run_id=run_id or (before.last_run_id if before else None),
                unreachable=unreachable,
                error=error,
            ),
        )


def record_check(
    store: Store,
    *,
    group: str,
    divergent: int | None,
    run_id: str | None,
    error: str | None,
    at_ns: int | None = None,
) -> None:
    """Remember a check; `error` set means it failed and `divergent` is None.

    A failed check keeps the divergent count and run id of the last successful one,
    so the divergence alert neither fires nor resolves because a replica is down.
    """
    store.execute(
        """INSERT INTO group_health (group_name, checked_ns, divergent, run_id, error)
               VALUES (?, ?, ?, ?, ?)
           ON CONFLICT (group_name) DO UPDATE SET checked_ns = excluded.checked_ns,
               divergent = CASE WHEN excluded.error IS NULL THEN excluded.divergent
                                ELSE group_health.divergent END,
               run_id = CASE WHEN excluded.error IS NULL THEN excluded.run_id
                             ELSE group_health.run_id END,
               error = excluded.error""",
        (group, at_ns or time.time_ns(), divergent, run_id, error),
    )


def probe_health(store: Store) -> dict[str, ProbeHealth]:
    rows = store.execute(
        "SELECT source, last_attempt_ns, last_success_ns, last_run_id, unreachable_json, error "
        "FROM probe_health ORDER BY source",
        last_known=True,
    )
    stored = {
        r.source: ProbeHealth(
            source=r.source,
            last_attempt_ns=r.last_attempt_ns,
            last_success_ns=r.last_success_ns,
            last_run_id=r.last_run_id,
            unreachable=json.loads(r.unreachable_json),
            error=r.error,
        )
        for r in rows
    }
    remembered = {str(k): v for k, v in store.remembered("probe_health").items()}
    return dict(sorted((stored | remembered).items()))


def group_health(store: Store) -> dict[str, GroupHealth]:
    rows = store.execute(
        "SELECT group_name, checked_ns, divergent, run_id, error FROM group_health "
        "ORDER BY group_name",
        last_known=True,
    )
    return {
        r.group_name: GroupHealth(
            group=r.group_name,
            checked_ns=r.checked_ns,
            divergent=r.divergent,
            run_id=r.run_id,
            error=r.error,
        )
        for r in rows
    }
