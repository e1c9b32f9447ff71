"""Failover RPO: what a failover to each replica would lose now, and the safest candidate.

In bytes: the replica's bytes behind at its upper bound (the primary's second
read), since whatever the primary wrote and the replica did not apply is
gone once the replica is promoted. In time: the probe's latest p99 lag to
that replica (writes younger than that may be missing), at least the
seconds its link has been down; without probe figures, bytes ÷ the
primary's write rate. A replica is a candidate only with its link up, no
sync in progress, read-only (`replica-read-only no` lets clients write to it:
what they wrote is not the primary's data), not found divergent by the latest
check or repair run that compared it, and a priority other than 0 (Sentinel
never promotes those); each passed-over replica says why. The safest
candidate loses the fewest bytes; Sentinel itself ranks by priority first, so
its pick can differ: the answer lists every replica.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replag.replication.check_verdicts import CheckVerdict
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
    read_only: bool | None = None
    last_check: dict[str, Any] | None = None  # CheckVerdict.to_dict(): run, age, keys

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "region": self.region,
            "status": self.status,
            "rpo_bytes": self.rpo_bytes,
            "rpo_s": None if self.rpo_s is None else round(self.rpo_s, 4),
            "rpo_s_from": self.rpo_s_from,
            "read_only": self.read_only,
            "last_check": self.last_check,
            "eligible": self.eligible,
            "reason": self.reason,
        }

    def line(self) -> str:
        """One text line: `127.0.0.1:6380 passed over: writable (…)` or its RPO."""
        rpo = "-" if self.rpo_bytes is None else f"{self.rpo_bytes} bytes"
        ro = {True: "read-only", False: "WRITABLE", None: "read-only unknown"}[self.read_only]
        check = "no check recorded"
        if self.last_check is not None:
            c = self.last_check
            check = f"{c['kind']} {c['run_id']} {c['age_s']:g} s ago: "
            check += f"{c['divergent_keys']} divergent"
        head = f"{self.replica}: {'candidate' if self.eligible else 'passed over'}"
        why = f" ({self.reason})" if self.reason else ""
        return f"{head}{why}; link {self.status}, behind {rpo}, {ro}, {check}"


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
    state: ReplicaState,
    *,
    lag_p99_ms: float | None,
    write_rate_bps: float | None,
    verdict: CheckVerdict | None = None,
    now_ns: int = 0,
) -> FailoverCandidate:
    """What promoting `state`'s replica would lose, and whether it can be promoted at all
    (`verdict`: the latest check or repair run that compared it)."""
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
    reasons = []
    if state.status != "ok":
        reasons.append(state.error or f"link {state.status}")
    elif state.sync_in_progress:
        reasons.append("sync in progress")
    if state.read_only is False:
        reasons.append("writable (replica-read-only no): clients may have written to it")
    if verdict is not None and verdict.divergent:
        reasons.append(verdict.describe(now_ns=now_ns))
    if state.priority == 0:
        reasons.append("replica-priority 0: never promoted")
    if not reasons and rpo_bytes is None:
        reasons.append("offset unknown")
    reason = "; ".join(reasons) or None
    return FailoverCandidate(
        replica=state.replica,
        region=state.region,
        status=state.status,
        rpo_bytes=rpo_bytes,
        rpo_s=rpo_s,
        rpo_s_from=rpo_from,
        eligible=reason is None,
        reason=reason,
        read_only=state.read_only,
        last_check=None if verdict is None else verdict.to_dict(now_ns=now_ns),
    )


def assess_failover(
    primary: PrimaryState,
    *,
    lag_p99_ms: Mapping[str, float],
    max_bytes: int = 0,
    max_lag_s: float | None = None,
    verdicts: Mapping[str, CheckVerdict] | None = None,
    now_ns: int = 0,
) -> FailoverAssessment:
    """Rank `primary`'s replicas by what a failover to each would lose; safe if the best
    loses at most `max_bytes` (and, if given, `max_lag_s` seconds of writes). `verdicts`:
    each replica's latest check (`replag.replication.check_verdicts.latest_verdicts`)."""
    verdicts = verdicts or {}
    candidates = [
        candidate(
            r,
            lag_p99_ms=lag_p99_ms.get(r.replica),
            write_rate_bps=primary.write_rate_bps,
            verdict=verdicts.get(r.replica),
            now_ns=now_ns,
        )
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
        if all(c.status != "ok" for c in candidates):
            why = "none with its link up"
        else:
            why = "; ".join(f"{c.replica}: {c.reason}" for c in candidates)
        safe, verdict = False, f"no replica can be promoted ({why})"
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
    passed = [c for c in candidates if not c.eligible]
    if passed and best is not None:
        verdict += "; passed over " + ", ".join(f"{c.replica} ({c.reason})" for c in passed)
    return FailoverAssessment(
        source=primary.source,
        primary=primary.primary,
        candidates=tuple(candidates),
        safe=safe,
        verdict=verdict,
        max_bytes=max_bytes,
        max_lag_s=max_lag_s,
    )
