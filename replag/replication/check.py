"""`failover-check`: sample every primary once and say whether failing over is safe now.

Unsafe (exit 1) when the best candidate of any primary would lose more than
`max_bytes` (or `max_lag_s` of writes), or no replica can be promoted; a
primary that cannot be read is an error (exit 2), not an answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from replag.config import Config
from replag.errors import UnreachableError, UsageError
from replag.replication.rpo import FailoverAssessment, assess_failover
from replag.replication.sampler import ReplicationSampler, replication_targets
from replag.replication.state import ReplicationSnapshot
from replag.store import Store

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


def recent_lag_p99_ms(
    store: Store, source: str, *, now_ns: int, freshness_s: float
) -> dict[str, float]:
    """Per replica, the p99 lag of the latest probe window from `source` (if fresh)."""
    latest: dict[str, float] = {}
    for window in store.windows(source=source, since_ns=now_ns - int(freshness_s * 1e9)):
        p99 = window.lag.summary_ms()["p99"]
        if p99 is not None:
            latest[window.replica] = p99  # oldest first: the last one wins
    return latest


async def failover_check(
    config: Config,
    *,
    source: str | None = None,
    max_bytes: int = 0,
    max_lag_s: float | None = None,
    store: Store | None = None,
) -> FailoverCheck:
    """Sample the primaries of `source` (default: every region writing to a Redis primary)."""
    sources = [config.topology.region(source)] if source else None
    targets, notes = replication_targets(config.topology, sources=sources)
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
