"""Replication samples, the primary each Sentinel region writes to, and failover events,
in the results store. This component owns (and prunes) its tables (their schema is in
the store's migrations).

`replication_primaries` / `replication_replicas`: one row per primary / replica
per sample. `write_primaries`: per region, the primary last written to and its
last offset seen (what a failover's bytes lost are measured from).
`failover_events`: each failover the probe followed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from replag.replication.state import PrimaryState, ReplicaState, ReplicationSnapshot
from replag.store import Row, Store

# "offset" is quoted: a keyword in PostgreSQL.
_PRIMARY_COLUMNS = (
    'sampled_ns, source, primary_name, address, "offset", replid, write_rate_bps, sync_full, '
    "sync_partial_ok, sync_partial_err, backlog_size, read_skew_ns, error"
)
_REPLICA_COLUMNS = (
    "sampled_ns, source, primary_name, replica, region, status, bytes_behind, "
    'bytes_uncertainty, backlog_headroom, headroom_fraction, "offset", last_io_s, link_down_s, '
    "read_only, sync_in_progress, priority, error"
)


def record_snapshot(store: Store, snapshot: ReplicationSnapshot) -> None:
    """Append one row per primary and per replica of `snapshot`."""
    statements: list[tuple[str, tuple[Any, ...]]] = []
    for p in snapshot.primaries:
        statements.append(
            (
                f"INSERT INTO replication_primaries ({_PRIMARY_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    p.sampled_ns,
                    p.source,
                    p.primary,
                    p.address,
                    p.offset,
                    p.replid,
                    p.write_rate_bps,
                    p.sync_full,
                    p.sync_partial_ok,
                    p.sync_partial_err,
                    p.backlog_size,
                    p.read_skew_ns,
                    p.error,
                ),
            )
        )
        statements.append(
            (
                """INSERT INTO replication_latest (source, primary_name, sampled_ns)
                   VALUES (?, ?, ?) ON CONFLICT (source, primary_name) DO UPDATE
                   SET sampled_ns = CASE WHEN excluded.sampled_ns > replication_latest.sampled_ns
                       THEN excluded.sampled_ns ELSE replication_latest.sampled_ns END""",
                (p.source, p.primary, p.sampled_ns),
            )
        )
        for r in p.replicas:
            statements.append(
                (
                    f"INSERT INTO replication_replicas ({_REPLICA_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        p.sampled_ns,
                        p.source,
                        p.primary,
                        r.replica,
                        r.region,
                        r.status,
                        r.bytes_behind,
                        r.bytes_uncertainty,
                        r.backlog_headroom,
                        r.headroom_fraction,
                        r.offset,
                        r.last_io_s,
                        r.link_down_s,
                        _flag_in(r.read_only),
                        _flag_in(r.sync_in_progress),
                        r.priority,
                        r.error,
                    ),
                )
            )
    store.transaction(statements)


def latest_primaries(store: Store, *, since_ns: int | None = None) -> list[PrimaryState]:
    """The latest sample of every (source, primary), with its replicas' rows."""
    newest = store.execute(
        """SELECT source, primary_name, sampled_ns FROM replication_latest
           WHERE sampled_ns >= ? ORDER BY source, primary_name""",
        (since_ns or 0,),
    )
    rows = [
        found[0]
        for source, primary, sampled_ns in (
            (r.source, r.primary_name, r.sampled_ns) for r in newest
        )
        if (
            found := store.execute(
                f"""SELECT {_PRIMARY_COLUMNS} FROM replication_primaries
                    WHERE source = ? AND primary_name = ? AND sampled_ns = ?
                    ORDER BY id DESC LIMIT 1""",
                (source, primary, sampled_ns),
            )
        )
    ]
    out = []
    for row in rows:
        replicas = store.execute(
            f"""SELECT {_REPLICA_COLUMNS} FROM replication_replicas
                WHERE sampled_ns = ? AND source = ? AND primary_name = ? ORDER BY replica""",
            (row.sampled_ns, row.source, row.primary_name),
        )
        out.append(_primary(row, tuple(_replica(r) for r in replicas)))
    return out


def replica_series(
    store: Store, *, source: str, replica: str, since_ns: int, until_ns: int | None = None
) -> list[tuple[int, ReplicaState]]:
    """(sampled_ns, ReplicaState) of one replica, oldest first."""
    rows = store.execute(
        f"""SELECT {_REPLICA_COLUMNS} FROM replication_replicas
            WHERE source = ? AND replica = ? AND sampled_ns >= ? AND sampled_ns < ?
            ORDER BY sampled_ns""",
        (source, replica, since_ns, until_ns if until_ns is not None else 2**62),
    )
    return [(r.sampled_ns, _replica(r)) for r in rows]


def _primary(row: Row, replicas: tuple[ReplicaState, ...]) -> PrimaryState:
    return PrimaryState(
        sampled_ns=row.sampled_ns,
        source=row.source,
        primary=row.primary_name,
        address=row.address,
        offset=row.offset,
        replid=row.replid,
        write_rate_bps=row.write_rate_bps,
        sync_full=row.sync_full,
        sync_partial_ok=row.sync_partial_ok,
        sync_partial_err=row.sync_partial_err,
        backlog_size=row.backlog_size,
        read_skew_ns=row.read_skew_ns,
        error=row.error,
        replicas=replicas,
    )


def _replica(row: Row) -> ReplicaState:
    return ReplicaState(
        replica=row.replica,
        region=row.region,
        address="",
        status=row.status,
        bytes_behind=row.bytes_behind,
        bytes_uncertainty=row.bytes_uncertainty,
        backlog_headroom=row.backlog_headroom,
        headroom_fraction=row.headroom_fraction,
        offset=row.offset,
        last_io_s=row.last_io_s,
        link_down_s=row.link_down_s,
        read_only=_flag_out(row.read_only),
        sync_in_progress=bool(row.sync_in_progress),
        priority=row.priority,
        error=row.error,
    )


def _flag_in(value: bool | None) -> int | None:
    return None if value is None else int(value)


def _flag_out(value: int | None) -> bool | None:
    return None if value is None else bool(value)


@dataclass(frozen=True, kw_only=True)
class WritePrimary:
    """The primary a Sentinel region was last written to, and its last offset seen."""

    region: str
    master: str
    address: str
    replid: str | None
    offset: int | None
    updated_ns: int


def write_primary(store: Store, region: str) -> WritePrimary | None:
    rows = store.execute(
        'SELECT region, master, address, replid, "offset", updated_ns FROM write_primaries '
        "WHERE region = ?",
        (region,),
    )
    if not rows:
        return None
    r = rows[0]
    return WritePrimary(
        region=r.region,
        master=r.master,
        address=r.address,
        replid=r.replid,
        offset=r.offset,
        updated_ns=r.updated_ns,
    )


def remember_write_primary(store: Store, record: WritePrimary) -> None:
    store.execute(
        """INSERT INTO write_primaries (region, master, address, replid, "offset", updated_ns)
           VALUES (?, ?, ?, ?, ?, ?)
           ON CONFLICT (region) DO UPDATE SET master = excluded.master,
               address = excluded.address, replid = excluded.replid,
               "offset" = excluded."offset", updated_ns = excluded.updated_ns""",
        (
            record.region,
            record.master,
            record.address,
            record.replid,
            record.offset,
            record.updated_ns,
        ),
    )


def record_failover(store: Store, event: dict[str, Any]) -> None:
    store.execute(
        "INSERT INTO failover_events (detected_ns, source, event_json) VALUES (?, ?, ?)",
        (event["detected_ns"], event["source"], json.dumps(event)),
    )


def failover_events(store: Store, *, since_ns: int = 0) -> list[dict[str, Any]]:
    rows = store.execute(
        "SELECT event_json FROM failover_events WHERE detected_ns >= ? ORDER BY detected_ns",
        (since_ns,),
    )
    return [dict(json.loads(r.event_json)) for r in rows]


def thin(store: Store, *, older_than_ns: int, window_ns: int) -> int:
    """Keep, of samples older than `older_than_ns`, one per replica (and primary) per
    `window_ns`: the replica's worst (most bytes behind), the primary's last (its
    counters only grow). Incremental: each range is thinned once. Returns rows deleted."""
    rows = store.execute("SELECT value FROM replication_meta WHERE key = 'thinned_until'")
    start = int(rows[0].value) if rows else 0
    # Whole windows only, so a window is never thinned in two passes.
    end = older_than_ns - older_than_ns % window_ns
    if end <= start:
        return 0
    deleted = 0
    for table, order in (
        ("replication_replicas", "COALESCE(bytes_behind, -1) DESC, sampled_ns DESC"),
        ("replication_primaries", "sampled_ns DESC"),
    ):
        who = "source, replica" if table == "replication_replicas" else "source, primary_name"
        gone = store.execute(
            f"""DELETE FROM {table} WHERE sampled_ns >= ? AND sampled_ns < ? AND id NOT IN (
                    SELECT id FROM (
                        SELECT id, ROW_NUMBER() OVER (
                            PARTITION BY {who}, sampled_ns / ? ORDER BY {order}) AS n
                        FROM {table} WHERE sampled_ns >= ? AND sampled_ns < ?) AS ranked
                    WHERE n = 1)""",
            (start, end, window_ns, start, end),
        )
        deleted += max(0, gone.rowcount)
    store.execute(
        "INSERT INTO replication_meta (key, value) VALUES ('thinned_until', ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (end,),
    )
    return deleted


def prune(store: Store, before_ns: int) -> dict[str, int]:
    """Delete samples and events older than `before_ns`; rows deleted per table."""
    deleted = {}
    for table, column in (
        ("replication_primaries", "sampled_ns"),
        ("replication_replicas", "sampled_ns"),
        ("failover_events", "detected_ns"),
    ):
        gone = store.execute(f"DELETE FROM {table} WHERE {column} < ?", (before_ns,))
        deleted[table] = max(0, gone.rowcount)
    return deleted
