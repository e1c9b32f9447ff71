"""What several `replag serve` instances on one store share besides leases.

`slot_claims`: periodic work claimed per time slot (`replag.service.slots`).
`alert_outbox`: each notification decided by an alert state change, written in
the same transaction as the change; delivered at least once (`delivered_ns`),
re-sent by the next owner of alert evaluation when its epoch is older.
`service_jobs`: checks and repairs started through a service's API, with the
instance running each (`owner`) and its run (`run_id`): a running job whose
owner died is claimed by another instance and resumed from its checkpoint.
"""

from __future__ import annotations

from replag.store.schema import Step

STEPS: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS slot_claims (
        name TEXT NOT NULL,
        slot INTEGER NOT NULL,
        holder TEXT NOT NULL,
        claimed_ns INTEGER NOT NULL,
        PRIMARY KEY (name, slot)
    )""",
    """CREATE TABLE IF NOT EXISTS alert_outbox (
        id INTEGER PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        event_json TEXT NOT NULL,
        created_ns INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        delivered_ns INTEGER
    )""",
    "CREATE INDEX IF NOT EXISTS alert_outbox_pending ON alert_outbox (delivered_ns, id)",
    """CREATE TABLE IF NOT EXISTS service_jobs (
        id TEXT PRIMARY KEY,
        action TEXT NOT NULL,
        group_name TEXT,
        options_json TEXT NOT NULL,
        state TEXT NOT NULL,
        owner TEXT NOT NULL,
        run_id TEXT,
        created_ns INTEGER NOT NULL,
        finished_ns INTEGER,
        divergent INTEGER,
        error TEXT,
        resumed INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX IF NOT EXISTS service_jobs_state ON service_jobs (state)",
)
