"""Topology discovery: Dynomite's admin port, INFO replication, Redis Cluster shards, Sentinel.

Each source returns a `Discovery` whose `render()` is the TOML file the rest
of replag reads, with comments saying where every entry came from. Dynomite's
/info figures are monitoring, not discovery: `replag.monitoring.dynomite_stats`.
"""

from replag.discovery.cluster import discover_cluster
from replag.discovery.dynomite import PortMap, discover_dynomite, fetch_consistency
from replag.discovery.replication import discover_replication
from replag.discovery.result import Discovery
from replag.discovery.sentinel import discover_sentinel

__all__ = [
    "Discovery",
    "PortMap",
    "discover_cluster",
    "discover_dynomite",
    "discover_replication",
    "discover_sentinel",
    "fetch_consistency",
]
