"""Topology discovery: Dynomite's admin port, INFO replication, Redis Cluster shards.

Each source returns a `Discovery` whose `render()` is the TOML file the rest
of replag reads, with comments saying where every entry came from.
"""

from replag.discovery.result import Discovery

__all__ = ["Discovery"]
