"""Where each primary is now, for `failover-check`: the one its Sentinels name (a region
under Sentinel), the one CLUSTER SHARDS names (a Redis Cluster shard), else the config's
write endpoint; then the replication check of those primaries.

After a failover the config still names the old primary: checked there, a failover
check would answer about a replica ("role slave") or a dead server.
"""

from __future__ import annotations

import dataclasses

from replag.config import Config
from replag.discovery.cluster_follow import current_shard, is_cluster_shard
from replag.replication.check import FailoverCheck, assess_primaries
from replag.replication.follow import home, sentinel_primary
from replag.store import Store
from replag.topology import Region, Topology


async def primaries_now(
    topology: Topology, source: str | None, *, timeout_s: float
) -> tuple[list[Region], list[str]]:
    """The regions of `source` (default: every one), each at the primary it has now, and
    notes on what moved (read only: nothing is remembered)."""
    regions = [topology.region(source)] if source else list(topology.regions)
    resolved: list[Region] = []
    notes: list[str] = []
    for region in regions:
        if region.write is None:
            resolved.append(region)
        elif region.sentinel is not None:
            write, found = await sentinel_primary(topology, region, timeout_s=timeout_s)
            resolved.append(dataclasses.replace(region, write=write))
            notes += found
        elif is_cluster_shard(region):
            now = await current_shard(topology, region, timeout_s=timeout_s)
            assert now.region.write is not None
            if home(now.region.write) != home(region.write):
                notes.append(
                    f"{region.name}: the primary is {home(now.region.write)} now (CLUSTER "
                    f"SHARDS of {now.seen_by}), not {home(region.write)} as configured"
                )
            resolved.append(now.region)
            notes += now.notes
        else:
            resolved.append(region)
    return resolved, notes


async def failover_check(
    config: Config,
    *,
    source: str | None = None,
    max_bytes: int = 0,
    max_lag_s: float | None = None,
    store: Store | None = None,
) -> FailoverCheck:
    """What `replag failover-check` runs: the primaries of `source` (default: every region
    writing to a Redis primary) found where they are now, sampled and assessed; after a
    failover the promoted replica is checked, the demoted or dead old primary among its
    candidates."""
    topology, timeout_s = config.topology, config.settings.connect_timeout
    regions, notes = await primaries_now(topology, source, timeout_s=timeout_s)
    return await assess_primaries(
        topology,
        regions,
        timeout_s=timeout_s,
        probe_interval_s=float(config.settings.probe_interval),
        notes=notes,
        max_bytes=max_bytes,
        max_lag_s=max_lag_s,
        store=store,
    )
