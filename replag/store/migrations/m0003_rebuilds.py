"""A rebuild's checkpoint (`replag.repair.bulk.rebuild_log`): its scan cursor and counters, and
the batches written but not yet verified."""

from __future__ import annotations

from replag.store.schema import Step

STEPS: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS repair_rebuilds (
        run_id TEXT PRIMARY KEY,
        cursor BLOB NOT NULL,
        stats_json TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS repair_rebuild_pending (
        run_id TEXT NOT NULL,
        batch INTEGER NOT NULL,
        keys BLOB NOT NULL,
        PRIMARY KEY (run_id, batch)
    )""",
)
