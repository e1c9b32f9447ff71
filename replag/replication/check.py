"""`failover-check`: sample every primary once and say whether failing over is safe now
(`replag.discovery.primaries.failover_check` finds the primaries first).

Unsafe (exit 1) when the best candidate of any primary would lose more than
`max_bytes` (or `max_lag_s` of writes), or no replica can be promoted; a
primary that cannot be read is an error (exit 2), not an answer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replag.errors import UnreachableError, UsageError
from replag.histogram import LagHistogram
from replag.replication.check_verdicts import latest_verdicts
from replag.replication.rpo import FailoverAssessment, assess_failover
from replag.replication.sampler import ReplicationSampler, replication_targets
from replag.replication.state import ReplicationSnapshot
from replag.store import Store
from replag.topology import Region, Topology

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

    def render(self) -> list[str]:
        """`failover-check --format text`: per primary its verdict, then each replica."""
        lines = []
        for a in self.assessments:
            state = "SAFE" if a.safe else "UNSAFE"
            lines.append(f"{state}: {a.source} (primary {a.primary}): {a.verdict}")
            lines += [f"  {c.line()}" for c in a.candidates]
        lines += [f"note: {n}" for n in self.snapshot.notes]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "safe": self.safe,
            "primaries": [a.to_dict() for a in self.assessments],
            "replication": self.snapshot.to_dict(),
        }


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


async def assess_primaries(
    topology: Topology,
    regions: Sequence[Region],
    *,
    timeout_s: float,
    probe_interval_s: float,
    notes: Sequence[str] = (),
    max_bytes: int = 0,
    max_lag_s: float | None = None,
    store: Store | None = None,
) -> FailoverCheck:
    """Sample the primaries of `regions` as given, and assess a failover of each.

    `replag.discovery.primaries.failover_check` first moves each region to the primary
    it has now (Sentinel's, a Redis Cluster shard's), and passes what it found in
    `notes`. `timeout_s`: each request's (settings.connect_timeout); a stored lag is
    recent within 3 probe intervals (settings.probe_interval)."""
    notes = list(notes)
    resolved = list(regions)
    targets, target_notes = replication_targets(topology, sources=resolved)
    notes += target_notes
    if not targets:
        why = "; ".join(notes) or "no region has a write endpoint"
        raise UsageError(f"no Redis primary to check: {why}")
    async with ReplicationSampler(timeout_s=timeout_s) as sampler:
        snapshot = await sampler.sample(targets)
    snapshot.notes += notes
    for primary in snapshot.primaries:
        if primary.error:
            raise UnreachableError(
                primary.error, where=f"primary {primary.primary} ({primary.address})"
            )
    freshness = max(_LAG_FRESHNESS_S, 3 * probe_interval_s)
    now = time.time_ns()
    verdicts = latest_verdicts(store) if store is not None else {}
    assessments = tuple(
        assess_failover(
            primary,
            lag_p99_ms=recent_lag_p99_ms(store, primary.source, now_ns=now, freshness_s=freshness)
            if store is not None
            else {},
            max_bytes=max_bytes,
            max_lag_s=max_lag_s,
            verdicts=verdicts,
            now_ns=now,
        )
        for primary in snapshot.primaries
    )
    return FailoverCheck(assessments=assessments, snapshot=snapshot)
