"""Leases (one holder per scheduled unit, with a fencing epoch) and who runs each repair run.

`leases`: see `replag.store.leases`. `repair_runs.owner` is the instance
(`replag.store.leases.instance_id()`) running the run and `heartbeat_ns` when it
last said so, on the database's clock: a `running` run whose heartbeat stopped
is shown as owned by a dead instance.
"""

from __future__ import annotations

from replag.store.schema import AddColumn, Step

STEPS: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        acquired_ns INTEGER NOT NULL,
        expires_ns INTEGER NOT NULL
    )""",
    AddColumn("repair_runs", "owner", "TEXT"),
    AddColumn("repair_runs", "heartbeat_ns", "INTEGER"),
)
