"""`failover-check`: sample every primary once and say whether failing over is safe now.

Unsafe (exit 1) when the best candidate of any primary would lose more than
`max_bytes` (or `max_lag_s` of writes), or no replica can be promoted; a
primary that cannot be read is an error (exit 2), not an answer.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from replag.config import Config
from replag.errors import UnreachableError, UsageError
from replag.histogram import LagHistogram
from replag.replication.follow import sentinel_primary
from replag.replication.rpo import FailoverAssessment, assess_failover
from replag.replication.sampler import ReplicationSampler, replication_targets
from replag.replication.state import ReplicationSnapshot
from replag.store import Store
from replag.topology import Region

# Probe figures older than this say nothing about the lag now.
_LAG_FRESHNESS_S = 300.0


@dataclass(frozen=True, kw_only=True)
class FailoverCheck:
    assessments: tuple[FailoverAssessment, ...]
    snapshot: ReplicationSnapshot

    @property
    def safe(self) -> bool:
        return all(a.safe for a in self.assessments)

    @property
    def exit_code(self) -> int:
        return 0 if self.safe else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "safe": self.safe,
            "primaries": [a.to_dict() for a in self.assessments],
            "replication": self.snapshot.to_dict(),
        }


async def _shard_now(config: Config, region: Region) -> tuple[Region, list[str]]:
    """A Cluster shard's region as CLUSTER SHARDS has it now, and what moved."""
    # Here, not at the top: cluster_follow reads probe figures through this module.
    from replag.discovery.cluster_follow import current_shard
    from replag.replication.follow import home

    assert region.write is not None
    now = await current_shard(config.topology, region, timeout_s=config.settings.connect_timeout)
    assert now.region.write is not None
    notes = list(now.notes)
    if home(now.region.write) != home(region.write):
        notes.insert(
            0,
            f"{region.name}: the primary is {home(now.region.write)} now (CLUSTER SHARDS of "
            f"{now.seen_by}), not {home(region.write)} as configured",
        )
    return now.region, notes


def recent_lag_p99_ms(
    store: Store, source: str, *, now_ns: int, freshness_s: float
) -> dict[str, float]:
    """Per replica, the p99 lag of the latest probe window from `source` (if fresh).

    One window per replica is read and decoded (the service asks every round)."""
    # Only windows within `freshness_s` (the end_ns index), newest first: the first of
    # each replica is its latest, and only those are decoded.
    rows = store.execute(
        """SELECT replica, lag_hist, out_of_range FROM lag_windows
           WHERE end_ns >= ? AND source = ? ORDER BY end_ns DESC, id DESC""",
        (now_ns - int(freshness_s * 1e9), source),
    )
    latest: dict[str, float] = {}
    seen: set[str] = set()
    for replica, payload, out_of_range in rows:
        if replica in seen:
            continue
        seen.add(replica)
        # One percentile straight from the HDR (summary_ms computes them all: ~100× slower).
        hist = LagHistogram.decode(payload, out_of_range)
        if hist.count:
            latest[replica] = hist.hdr.get_value_at_percentile(99) / 1000
    return latest


async def failover_check(
    config: Config,
    *,
    source: str | None = None,
    max_bytes: int = 0,
    max_lag_s: float | None = None,
    store: Store | None = None,
) -> FailoverCheck:
    """Sample the primaries of `source` (default: every region writing to a Redis primary).

    A region under Sentinel is checked at the primary its Sentinels name now, a Redis
    Cluster shard at the primary CLUSTER SHARDS names now (after a failover, the
    promoted replica, with the demoted or dead old primary among the candidates), not
    at the config's write endpoint."""
    topology = config.topology
    sources, resolved = [topology.region(source)] if source else list(topology.regions), []
    notes: list[str] = []
    timeout_s = config.settings.connect_timeout
    for region in sources:
        if region.write is None:
            resolved.append(region)
        elif region.sentinel is not None:
            write, found = await sentinel_primary(topology, region, timeout_s=timeout_s)
            resolved.append(dataclasses.replace(region, write=write))
            notes += found
        elif region.slots or region.shard:
            shard, found = await _shard_now(config, region)
            resolved.append(shard)
            notes += found
        else:
            resolved.append(region)
    targets, target_notes = replication_targets(topology, sources=resolved)
    notes += target_notes
    if not targets:
        why = "; ".join(notes) or "no region has a write endpoint"
        raise UsageError(f"no Redis primary to check: {why}")
    async with ReplicationSampler(timeout_s=config.settings.connect_timeout) as sampler:
        snapshot = await sampler.sample(targets)
    snapshot.notes += notes
    for primary in snapshot.primaries:
        if primary.error:
            raise UnreachableError(
                primary.error, where=f"primary {primary.primary} ({primary.address})"
            )
    freshness = max(_LAG_FRESHNESS_S, 3 * float(config.settings.probe_interval))
    now = time.time_ns()
    assessments = tuple(
        assess_failover(
            primary,
            lag_p99_ms=recent_lag_p99_ms(store, primary.source, now_ns=now, freshness_s=freshness)
            if store is not None
            else {},
            max_bytes=max_bytes,
            max_lag_s=max_lag_s,
        )
        for primary in snapshot.primaries
    )
    return FailoverCheck(assessments=assessments, snapshot=snapshot)
