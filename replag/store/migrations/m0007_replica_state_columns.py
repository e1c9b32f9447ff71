"""`replication_replicas` keeps what the failover advice reads of a replica besides its
offsets: whether it is read-only (`replica-read-only`), syncing, its `replica-priority`
and the error that made it not ok. A past sample's advice, or one served from the store
by another instance, then says what the live one said (a writable replica passed over).
"""

from __future__ import annotations

from replag.store.schema import AddColumn, Step

STEPS: tuple[Step, ...] = (
    # 1 read-only, 0 writable, NULL unknown (a row from before this column, a replica
    # that did not say).
    AddColumn("replication_replicas", "read_only", "INTEGER"),
    AddColumn("replication_replicas", "sync_in_progress", "INTEGER"),
    AddColumn("replication_replicas", "priority", "INTEGER"),
    AddColumn("replication_replicas", "error", "TEXT"),
)
