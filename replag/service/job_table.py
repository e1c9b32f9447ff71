"""The job table: checks and repairs a service runs, and who runs each, in the store.

Every job an instance starts is a `service_jobs` row owned by it (`owner`, its
instance id), with its run id once the run is recorded. A row still `running`
whose owner's `instance:` lease has expired belongs to a dead instance: any
instance claims it (`FOR UPDATE SKIP LOCKED` on PostgreSQL, so two instances
never claim one row; SQLite's write lock serialises the same transaction) and
resumes the run from its checkpoint (`repair … --resume RUN`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from replag.store import Store

ORPHANS = """SELECT id, action, group_name, options_json, run_id, owner FROM service_jobs
    WHERE state = 'running' AND owner NOT IN (
        SELECT holder FROM leases WHERE name LIKE 'instance:%' AND expires_ns > {now})
    ORDER BY created_ns LIMIT 1{lock}"""


@dataclass(frozen=True, kw_only=True)
class OrphanJob:
    id: str
    action: str
    group: str | None
    options: dict[str, Any]
    run_id: str | None
    previous_owner: str


class JobTable:
    def __init__(self, store: Store, *, holder: str) -> None:
        self.store = store
        self.holder = holder

    def started(self, job_id: str, action: str, group: str | None, options: dict[str, Any],
                *, created_ns: int) -> None:  # fmt: skip
        self.store.execute(
            """INSERT INTO service_jobs (id, action, group_name, options_json, state, owner,
                   created_ns) VALUES (?, ?, ?, ?, 'running', ?, ?)
               ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, state = 'running'""",
            (job_id, action, group, json.dumps(options), self.holder, created_ns),
        )

    def run_recorded(self, job_id: str, run_id: str) -> None:
        self.store.execute("UPDATE service_jobs SET run_id = ? WHERE id = ?", (run_id, job_id))

    def finished(self, job_id: str, *, state: str, finished_ns: int, divergent: int | None,
                 error: str | None) -> None:  # fmt: skip
        self.store.execute(
            """UPDATE service_jobs SET state = ?, finished_ns = ?, divergent = ?, error = ?
               WHERE id = ? AND owner = ?""",
            (state, finished_ns, divergent, error, job_id, self.holder),
        )

    def give_back(self, orphan: OrphanJob) -> None:
        """Undo `claim_orphan` (the job could not start yet): an orphan again, claimed
        again at the next look, by this instance or another."""
        self.store.execute(
            """UPDATE service_jobs SET owner = ?, resumed = resumed - 1
               WHERE id = ? AND owner = ? AND state = 'running'""",
            (orphan.previous_owner, orphan.id, self.holder),
        )

    def claim_orphan(self) -> OrphanJob | None:
        """Take one running job whose owner died; None when there is none."""
        lock = " FOR UPDATE SKIP LOCKED" if self.store.backend == "postgresql" else ""
        with self.store.begin() as tx:
            rows = tx.execute(ORPHANS.format(now=self.store.now_ns_sql, lock=lock))
            if not rows:
                return None
            row = rows[0]
            tx.execute(
                "UPDATE service_jobs SET owner = ?, resumed = resumed + 1 WHERE id = ?",
                (self.holder, row.id),
            )
        return OrphanJob(
            id=row.id,
            action=row.action,
            group=row.group_name,
            options=json.loads(row.options_json),
            run_id=row.run_id,
            previous_owner=row.owner,
        )
