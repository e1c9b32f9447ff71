"""`instance_stored`: when (database clock) each service instance last had no write held.

After a store outage the evaluator of alerts reads the store again only once every
instance that was live when it went away has said, after the store's return, that
nothing of what it held meanwhile (alert states decided and sent from memory, probe
runs) is still waiting to be written (`replag.store.held_marks`).
"""

from __future__ import annotations

from replag.store.schema import Step

STEPS: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS instance_stored (
        holder TEXT PRIMARY KEY,
        stored_ns INTEGER NOT NULL
    )""",
)
