"""What several `replag serve` instances on one store share besides leases.

`slot_claims`: periodic work claimed per time slot (`replag.service.slots`).
`alert_outbox`: each notification decided by an alert state change, written in
the same transaction as the change; delivered at least once (`delivered_ns`),
re-sent by the next owner of alert evaluation when its epoch is older.
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
)
