"""Topology discovery: Dynomite's admin port, INFO replication, Redis Cluster shards.

Each source returns a `Discovery` whose `render()` is the TOML file the rest
of replag reads, with comments saying where every entry came from. Dynomite's
/info figures (dropped peer requests above all) live in `dynomite_info`.
"""

from replag.discovery.cluster import discover_cluster
from replag.discovery.dynomite import PortMap, discover_dynomite, fetch_consistency
from replag.discovery.dynomite_info import (
    DROPPED_WRITES_MESSAGE,
    DroppedWrites,
    DynomiteStats,
    collect_dynomite_stats,
    find_dropped_writes,
)
from replag.discovery.replication import discover_replication
from replag.discovery.result import Discovery

__all__ = [
    "DROPPED_WRITES_MESSAGE",
    "Discovery",
    "DroppedWrites",
    "DynomiteStats",
    "PortMap",
    "collect_dynomite_stats",
    "discover_cluster",
    "discover_dynomite",
    "discover_replication",
    "fetch_consistency",
    "find_dropped_writes",
]
