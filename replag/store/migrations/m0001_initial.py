"""The schema as it stood before numbered migrations, so stores from then are adopted.

Every statement is IF NOT EXISTS and every later column an AddColumn: an old
SQLite store gains what it lacks, a new store gets it all.
"""

from __future__ import annotations

from replag.store.schema import AddColumn, Step

# Dynomite /info figures collected when this migration shipped (one column each); a
# figure added later comes with a migration of its own.
DYNOMITE_FIGURES = (
    "peer_dropped_requests",
    "peer_timedout_requests",
    "remote_peer_dropped_requests",
    "remote_peer_timedout_requests",
    "client_dropped_requests",
    "client_non_quorum_w_responses",
    "peer_eof",
    "peer_err",
    "peer_timedout",
    "remote_peer_timedout",
    "peer_connections",
    "peer_ejects",
    "peer_in_queue",
    "peer_out_queue",
    "remote_peer_in_queue",
    "remote_peer_out_queue",
    "cross_zone_latency_avg_us",
    "cross_zone_latency_p99_us",
    "cross_region_rtt_avg_us",
    "cross_region_rtt_p99_us",
    "cross_zone_queue_wait_p99_us",
    "cross_region_queue_wait_p99_us",
    "peer_out_queue_p99",
    "remote_peer_out_queue_p99",
    "server_latency_p99_us",
    "server_dropped_requests",
    "server_timedout_requests",
)

_LAG: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS lag_windows (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        source TEXT NOT NULL,
        target TEXT NOT NULL,
        replica TEXT NOT NULL,
        start_ns INTEGER NOT NULL,
        end_ns INTEGER NOT NULL,
        sent INTEGER NOT NULL,
        seen INTEGER NOT NULL,
        lost INTEGER NOT NULL,
        out_of_range INTEGER NOT NULL DEFAULT 0,
        lag_hist BLOB NOT NULL,
        uncertainty_hist BLOB NOT NULL,
        write_hist BLOB NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS lag_windows_pair ON lag_windows (source, target, end_ns)",
    "CREATE INDEX IF NOT EXISTS lag_windows_end ON lag_windows (end_ns)",
    """CREATE TABLE IF NOT EXISTS probe_runs (
        run_id TEXT PRIMARY KEY,
        started_ns INTEGER NOT NULL,
        finished_ns INTEGER NOT NULL,
        source TEXT NOT NULL,
        mode TEXT NOT NULL,
        summary_json TEXT NOT NULL
    )""",
    "CREATE TABLE IF NOT EXISTS store_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)

_HEALTH: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS probe_health (
        source TEXT PRIMARY KEY,
        last_attempt_ns INTEGER NOT NULL,
        last_success_ns INTEGER,
        last_run_id TEXT,
        unreachable_json TEXT NOT NULL DEFAULT '[]',
        error TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS group_health (
        group_name TEXT PRIMARY KEY,
        checked_ns INTEGER NOT NULL,
        divergent INTEGER,
        run_id TEXT,
        error TEXT
    )""",
)

_ALERTS: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS alert_state (
        fingerprint TEXT PRIMARY KEY,
        rule TEXT NOT NULL,
        labels_json TEXT NOT NULL,
        status TEXT NOT NULL,
        value REAL,
        summary TEXT NOT NULL,
        active_since_ns INTEGER NOT NULL,
        fired_ns INTEGER,
        resolved_ns INTEGER,
        last_notified_ns INTEGER,
        updated_ns INTEGER NOT NULL,
        nodata_since_ns INTEGER
    )""",
    AddColumn("alert_state", "nodata_since_ns", "INTEGER"),
    """CREATE TABLE IF NOT EXISTS alert_events (
        id INTEGER PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        rule TEXT NOT NULL,
        labels_json TEXT NOT NULL,
        status TEXT NOT NULL,
        at_ns INTEGER NOT NULL,
        value REAL,
        summary TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS alert_events_at ON alert_events (at_ns)",
    """CREATE TABLE IF NOT EXISTS alert_deliveries (
        sink TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        last_attempt_ns INTEGER NOT NULL,
        last_ok_ns INTEGER,
        last_status TEXT NOT NULL,
        last_error TEXT,
        delivered INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0
    )""",
)

_REPAIR: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS repair_runs (
        run_id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        started_ns INTEGER NOT NULL,
        finished_ns INTEGER,
        params_json TEXT NOT NULL,
        report_json TEXT,
        error TEXT
    )""",
    # One row per replica being scanned, rewritten at each checkpoint: the cursor and
    # the Tictac tree of the keys before it (512 KB at depth 16, whatever the keyspace).
    """CREATE TABLE IF NOT EXISTS repair_scan_state (
        run_id TEXT NOT NULL,
        group_name TEXT NOT NULL,
        replica TEXT NOT NULL,
        cursor BLOB NOT NULL,
        keys INTEGER NOT NULL,
        seconds REAL NOT NULL,
        finished INTEGER NOT NULL,
        total INTEGER,
        tree BLOB NOT NULL,
        PRIMARY KEY (run_id, group_name, replica)
    )""",
    # Checkpoints used to hold every key scanned (tens of MB a run): gone.
    "DROP TABLE IF EXISTS repair_scan_chunks",
    """CREATE TABLE IF NOT EXISTS repair_groups (
        run_id TEXT NOT NULL,
        group_name TEXT NOT NULL,
        phase TEXT NOT NULL,
        stats_json TEXT NOT NULL,
        PRIMARY KEY (run_id, group_name)
    )""",
    """CREATE TABLE IF NOT EXISTS repair_keys (
        run_id TEXT NOT NULL,
        group_name TEXT NOT NULL,
        key BLOB NOT NULL,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        detail_json TEXT NOT NULL,
        PRIMARY KEY (run_id, group_name, key)
    )""",
    "CREATE INDEX IF NOT EXISTS repair_runs_started ON repair_runs (started_ns)",
)

_REPLICATION: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS replication_primaries (
        id INTEGER PRIMARY KEY,
        sampled_ns INTEGER NOT NULL,
        source TEXT NOT NULL,
        primary_name TEXT NOT NULL,
        address TEXT NOT NULL,
        "offset" INTEGER,
        replid TEXT,
        write_rate_bps REAL,
        sync_full INTEGER,
        sync_partial_ok INTEGER,
        sync_partial_err INTEGER,
        backlog_size INTEGER,
        read_skew_ns INTEGER NOT NULL,
        error TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS replication_primaries_time ON replication_primaries (sampled_ns)",
    """CREATE INDEX IF NOT EXISTS replication_primaries_primary
        ON replication_primaries (source, primary_name, sampled_ns)""",
    """CREATE TABLE IF NOT EXISTS replication_replicas (
        id INTEGER PRIMARY KEY,
        sampled_ns INTEGER NOT NULL,
        source TEXT NOT NULL,
        primary_name TEXT NOT NULL,
        replica TEXT NOT NULL,
        region TEXT NOT NULL,
        status TEXT NOT NULL,
        bytes_behind INTEGER,
        bytes_uncertainty INTEGER,
        backlog_headroom INTEGER,
        headroom_fraction REAL,
        "offset" INTEGER,
        last_io_s INTEGER,
        link_down_s INTEGER
    )""",
    "CREATE INDEX IF NOT EXISTS replication_replicas_time ON replication_replicas (sampled_ns)",
    """CREATE INDEX IF NOT EXISTS replication_replicas_replica
        ON replication_replicas (source, replica, sampled_ns)""",
    """CREATE TABLE IF NOT EXISTS write_primaries (
        region TEXT PRIMARY KEY,
        master TEXT NOT NULL,
        address TEXT NOT NULL,
        replid TEXT,
        "offset" INTEGER,
        updated_ns INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS failover_events (
        id INTEGER PRIMARY KEY,
        detected_ns INTEGER NOT NULL,
        source TEXT NOT NULL,
        event_json TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS failover_events_time ON failover_events (detected_ns)",
    "CREATE TABLE IF NOT EXISTS replication_meta (key TEXT PRIMARY KEY, value INTEGER)",
    # The newest sample of each primary, so reading "now" never scans the history.
    """CREATE TABLE IF NOT EXISTS replication_latest (
        source TEXT NOT NULL,
        primary_name TEXT NOT NULL,
        sampled_ns INTEGER NOT NULL,
        PRIMARY KEY (source, primary_name)
    )""",
)

_DYNOMITE: tuple[Step, ...] = (
    "CREATE TABLE IF NOT EXISTS dynomite_stats (\n"
    "    id INTEGER PRIMARY KEY,\n"
    "    node TEXT NOT NULL,\n"
    "    dc TEXT NOT NULL,\n"
    "    rack TEXT NOT NULL,\n"
    "    sampled_ns INTEGER NOT NULL,\n"
    "    uptime_s INTEGER NOT NULL,\n"
    + "".join(f"    {name} INTEGER,\n" for name in DYNOMITE_FIGURES)
    + "    backends TEXT NOT NULL\n)",
    *(AddColumn("dynomite_stats", name, "INTEGER") for name in DYNOMITE_FIGURES),
    "CREATE INDEX IF NOT EXISTS dynomite_stats_node ON dynomite_stats (node, sampled_ns)",
    # Time-range reads (the dropped-writes rule, retention pruning) without a table scan.
    "CREATE INDEX IF NOT EXISTS dynomite_stats_time ON dynomite_stats (sampled_ns)",
)

STEPS: tuple[Step, ...] = _LAG + _HEALTH + _ALERTS + _REPAIR + _REPLICATION + _DYNOMITE
