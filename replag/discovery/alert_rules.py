"""The alert rules `topology discover` writes into a new file, so a new install alerts on
what it sees: divergence, a replica not replicating, lag over a threshold, an
unreachable replica, stale probes (and, for Redis primaries, bytes behind).

Each is an ordinary `[[alerts.rules]]` table (docs/alerts.md): edit, remove or add
to them; a sink (`[[alerts.sinks]]`) says where they go besides the dashboard,
`/api/v1/alerts` and the log.
"""

from __future__ import annotations

from replag.topology import Topology

# (name, kind, extra lines, comment)
_COMMON: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("divergence", "divergent_keys", ('severity = "critical"',),
     "the latest check or repair run (CLI or serve) left keys that differ"),
    ("replica-unreachable", "unreachable", ('severity = "critical"', 'for = "1m"'),
     "the latest probe could not reach a replica (or the write endpoint)"),
    ("lag", "lag_p99", ('threshold = "1s"', 'for = "5m"', 'over = "5m"'),
     "p99 replication lag over 1 s for 5 minutes"),
    ("stale-probes", "no_probe", ('threshold = "10m"', 'severity = "critical"'),
     "no successful probe from a region for 10 minutes"),
)  # fmt: skip
_REDIS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("not-replicating", "replication_link_down", ('threshold = "30s"', 'severity = "critical"'),
     "a replica's link down, resyncing or replicating from elsewhere for 30 s"),
    ("bytes-behind", "replication_bytes_behind", ('threshold = "16mb"', 'for = "1m"'),
     "a replica more than 16 MB behind its primary for a minute"),
)  # fmt: skip


def default_alert_rules(topology: Topology) -> str:
    """TOML `[[alerts.rules]]` tables for `topology` (the replication rules where a
    region writes to a Redis primary)."""
    rules = list(_COMMON)
    if any(r.write is not None and r.write.kind == "redis" for r in topology.regions):
        rules += _REDIS
    lines = [
        "# Alert rules written at discovery, so a new install alerts on what it sees (see",
        "# docs/alerts.md); add [[alerts.sinks]] to be notified besides the dashboard and log.",
    ]
    for name, kind, extra, comment in rules:
        lines += ["", f"# {comment}", "[[alerts.rules]]", f'name = "{name}"', f'kind = "{kind}"']
        lines += list(extra)
    return "\n".join(lines) + "\n"
