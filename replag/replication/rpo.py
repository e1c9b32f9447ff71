"""Failover RPO: what a failover to each replica would lose now, and the safest candidate.

In bytes: the replica's bytes behind at its upper bound (the primary's second
read), since whatever the primary wrote and the replica did not apply is
gone once the replica is promoted. In time: the probe's latest p99 lag to
that replica (writes younger than that may be missing), at least the
seconds its link has been down; without probe figures, bytes ÷ the
primary's write rate. A replica is a candidate only with its link up, no
sync in progress and a priority other than 0 (Sentinel never promotes
those). The safest candidate loses the fewest bytes; Sentinel itself ranks by
priority first, so its pick can differ: the answer lists every replica.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replag.replication.state import PrimaryState, ReplicaState


@dataclass(frozen=True, kw_only=True)
class FailoverCandidate:
    replica: str
    region: str
    status: str
    rpo_bytes: int | None
    rpo_s: float | None
    rpo_s_from: str | None
    eligible: bool
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "region": self.region,
            "status": self.status,
            "rpo_bytes": self.rpo_bytes,
            "rpo_s": None if self.rpo_s is None else round(self.rpo_s, 4),
            "rpo_s_from": self.rpo_s_from,
            "eligible": self.eligible,
            "reason": self.reason,
        }


@dataclass(frozen=True, kw_only=True)
class FailoverAssessment:
    """One primary: its candidates best first, the safest, and whether failing over is safe."""

    source: str
    primary: str
    candidates: tuple[FailoverCandidate, ...]
    safe: bool
    verdict: str
    max_bytes: int
    max_lag_s: float | None = None

    @property
    def safest(self) -> FailoverCandidate | None:
        first = self.candidates[0] if self.candidates else None
        return first if first is not None and first.eligible else None

    def to_dict(self) -> dict[str, Any]:
        safest = self.safest
        return {
            "source": self.source,
            "primary": self.primary,
            "safe": self.safe,
            "verdict": self.verdict,
            "safest": safest.replica if safest else None,
            "rpo_bytes": safest.rpo_bytes if safest else None,
            "rpo_s": safest.to_dict()["rpo_s"] if safest else None,
            "max_bytes": self.max_bytes,
            "max_lag_s": self.max_lag_s,
            "candidates": [c.to_dict() for c in self.candidates],
        }


def candidate(
    state: ReplicaState, *, lag_p99_ms: float | None, write_rate_bps: float | None
) -> FailoverCandidate:
    """What promoting `state`'s replica would lose, and whether it can be promoted at all."""
    rpo_bytes = state.bytes_behind_max
    times: list[tuple[float, str]] = []
    if lag_p99_ms is not None:
        times.append((lag_p99_ms / 1000, "probe p99 lag"))
    if state.status == "link-down" and state.link_down_s is not None:
        times.append((float(state.link_down_s), "link down since"))
    if not times and rpo_bytes is not None:
        if rpo_bytes == 0:
            times.append((0.0, "no bytes behind"))
        elif write_rate_bps:
            times.append((rpo_bytes / write_rate_bps, "bytes behind ÷ write rate"))
    rpo_s, rpo_from = max(times) if times else (None, None)
    reason = None
    if state.status != "ok":
        reason = state.error or f"link {state.status}"
    elif state.sync_in_progress:
        reason = "sync in progress"
    elif state.priority == 0:
        reason = "replica-priority 0: never promoted"
    elif rpo_bytes is None:
        reason = "offset unknown"
    return FailoverCandidate(
        replica=state.replica,
        region=state.region,
        status=state.status,
        rpo_bytes=rpo_bytes,
        rpo_s=rpo_s,
        rpo_s_from=rpo_from,
        eligible=reason is None,
        reason=reason,
    )


def assess_failover(
    primary: PrimaryState,
    *,
    lag_p99_ms: Mapping[str, float],
    max_bytes: int = 0,
    max_lag_s: float | None = None,
) -> FailoverAssessment:
    """Rank `primary`'s replicas by what a failover to each would lose; safe if the best
    loses at most `max_bytes` (and, if given, `max_lag_s` seconds of writes)."""
    candidates = [
        candidate(r, lag_p99_ms=lag_p99_ms.get(r.replica), write_rate_bps=primary.write_rate_bps)
        for r in primary.replicas
    ]

    def rank(c: FailoverCandidate) -> tuple[bool, float, float, str]:
        return (
            not c.eligible,
            math.inf if c.rpo_bytes is None else c.rpo_bytes,
            math.inf if c.rpo_s is None else c.rpo_s,
            c.replica,
        )

    candidates.sort(key=rank)
    best = candidates[0] if candidates and candidates[0].eligible else None
    if primary.error:
        safe, verdict = False, f"primary not sampled: {primary.error}"
    elif best is None:
        safe, verdict = False, "no replica can be promoted (none with its link up)"
    elif best.rpo_bytes is not None and best.rpo_bytes > max_bytes:
        safe = False
        verdict = f"{best.replica} would lose up to {best.rpo_bytes} bytes (> {max_bytes})"
    elif max_lag_s is not None and (best.rpo_s is None or best.rpo_s > max_lag_s):
        safe = False
        lost = "an unknown time" if best.rpo_s is None else f"{best.rpo_s * 1000:.1f} ms"
        verdict = f"{best.replica} would lose {lost} of writes (> {max_lag_s * 1000:g} ms)"
    else:
        safe = True
        verdict = f"fail over to {best.replica}: loses at most {best.rpo_bytes} bytes"
    return FailoverAssessment(
        source=primary.source,
        primary=primary.primary,
        candidates=tuple(candidates),
        safe=safe,
        verdict=verdict,
        max_bytes=max_bytes,
        max_lag_s=max_lag_s,
    )
