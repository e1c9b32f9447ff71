"""The service's verdict on replication right now: ok, degraded or failing, and why.

Judged from the latest probe run of every source (the freshest evidence), not
from a range: a replica that answers but saw none of the last run's probes is
not replicating, whatever its p99 was an hour ago, and whatever its siblings in
the same region do. `GET /api/v1/health` and the dashboard's badge show this
verdict; `pairs` lets the matrix mark each pair and, in its `replicas`, each
replica (a pair's state is its worst replica's).

Critical (failing): a source whose probe failed or is stale, an unreachable
replica, a replica that saw none of its probes, a replica the latest replication
sample found not replicating (link down, syncing, replicating from elsewhere) or
a primary it could not read. Warning (degraded): a replica that lost more than
`max_loss` of them, a replica the latest check or repair run (whoever ran it)
found divergent, a writable replica, alerts firing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from replag.alerts.health import ProbeHealth, probe_health
from replag.config import Config
from replag.lagindex import LagIndex
from replag.replication.check_verdicts import CheckVerdict
from replag.replication.state import PrimaryState
from replag.store import Store

Severity = Literal["critical", "warning"]
Verdict = Literal["ok", "degraded", "failing"]
PairState = Literal["ok", "lossy", "not_replicating"]

# A source is stale when its last success is older than this many probe intervals
# (plus the probe timeout): one late round is noise, three are an outage.
STALE_INTERVALS = 3


@dataclass(frozen=True, kw_only=True)
class HealthProblem:
    # probe_error | stale | unreachable | not_replicating | loss | alerts | store |
    # replication | writable | divergence | not_compared
    kind: str
    severity: Severity
    message: str
    source: str | None = None
    target: str | None = None
    replica: str | None = None
    group: str | None = None

    @property
    def key(self) -> tuple[str, str | None, str | None, str | None, str | None]:
        """What the problem is about (its message changes as it goes on: ages, counts)."""
        return (self.kind, self.source, self.target, self.replica, self.group)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "source": self.source,
            "target": self.target,
            "replica": self.replica,
        }
        if self.group is not None:
            out["group"] = self.group
        return out


_STATE_ORDER: tuple[PairState, ...] = ("ok", "lossy", "not_replicating")


@dataclass(frozen=True, kw_only=True)
class PairHealth:
    """One (source, target) — or one replica of it — in its source's latest run.

    A pair's figures are its replicas' summed, its state the worst of theirs."""

    source: str
    target: str
    state: PairState
    run_end_ns: int
    sent: int
    lost: int
    last_seen_ns: int | None  # end of the last run in which a probe was seen
    replica: str | None = None
    replicas: tuple[PairHealth, ...] = ()
    # A pair replicating again: the end of the first run that saw probes after its last
    # run that saw none (None: not down before, or down now).
    recovered_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "target": self.target,
            "replica": self.replica,
            "state": self.state,
            "run_end_ns": self.run_end_ns,
            "sent": self.sent,
            "lost": self.lost,
            "last_seen_ns": self.last_seen_ns,
        }
        if self.replica is None:
            out["replicas"] = [r.to_dict() for r in self.replicas]
            out["recovered_ns"] = self.recovered_ns
        return out


@dataclass(frozen=True, kw_only=True)
class HealthVerdict:
    problems: list[HealthProblem] = field(default_factory=list)
    pairs: list[PairHealth] = field(default_factory=list)

    @property
    def status(self) -> Verdict:
        severities = {p.severity for p in self.problems}
        if "critical" in severities:
            return "failing"
        return "degraded" if severities else "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "problems": [p.to_dict() for p in self.problems],
            "pairs": [p.to_dict() for p in self.pairs],
        }


def replication_health(
    config: Config,
    index: LagIndex,
    *,
    now_ns: int,
    alerts_firing: int = 0,
    unseen: frozenset[str] = frozenset(),
) -> HealthVerdict:
    """The verdict now, from the store's probe outcomes and the latest lag windows.

    `unseen`: sources probed by another instance while the store (through which this one
    sees their runs) is away: their last runs are not judged here meanwhile (the store
    problem says why)."""
    settings = config.settings
    stale_s = STALE_INTERVALS * settings.probe_interval + settings.timeout
    sources = [r.name for r in config.topology.regions if r.write is not None]
    targets = {r.name for r in config.topology.regions}
    health = probe_health(index.store)
    problems: list[HealthProblem] = []
    for source in sources:
        if source in unseen:
            continue
        problems += _source_problems(health.get(source), source, now_ns=now_ns, stale_s=stale_s)
    pairs = []
    replicas: dict[tuple[str, str], list[str]] = {}
    for source, target, replica in index.replicas():
        replicas.setdefault((source, target), []).append(replica)
    # A replica the latest run could not reach is said once, as unreachable: not also as
    # "reachable, not replicating" from the probes it could not see.
    unreachable = {(p.source, p.replica) for p in problems if p.kind == "unreachable"}
    for source, target in index.pairs():
        if source not in sources or target not in targets:
            continue
        pair = _pair_health(index, source, target, replicas.get((source, target), []))
        pairs.append(pair)
        for one in pair.replicas:
            if (source, one.replica) in unreachable:
                continue
            problems += _pair_problems(one, max_loss=settings.max_loss or 0.0, now_ns=now_ns)
    if alerts_firing:
        problems.append(
            HealthProblem(
                kind="alerts", severity="warning", message=f"{alerts_firing} alerts firing"
            )
        )
    return HealthVerdict(problems=problems, pairs=pairs)


def _source_problems(
    health: ProbeHealth | None, source: str, *, now_ns: int, stale_s: float
) -> list[HealthProblem]:
    if health is None:
        return []  # never probed: nothing known yet
    out = []
    if health.error:
        out.append(
            HealthProblem(
                kind="probe_error",
                severity="critical",
                source=source,
                message=f"probe from {source} failed: {health.error}",
            )
        )
    age_s = (now_ns - (health.last_success_ns or health.last_attempt_ns)) / 1e9
    if age_s > stale_s:
        out.append(
            HealthProblem(
                kind="stale",
                severity="critical",
                source=source,
                message=f"no successful probe from {source} for {age_s:.0f} s "
                f"(expected every {stale_s:g} s at most)",
            )
        )
    for item in health.unreachable:
        if health.error and item.get("region") == source:
            continue  # the write endpoint itself: said by probe_error
        out.append(
            _replica_problem(
                "unreachable",
                "critical",
                source,
                item.get("region"),
                item.get("replica"),
                f"replica {item.get('replica')} in {item.get('region')} unreachable "
                f"from {source}: {item.get('error', 'no answer')}",
            )
        )
    return out


def _pair_health(index: LagIndex, source: str, target: str, replicas: list[str]) -> PairHealth:
    """The pair in its source's latest run, with each replica that run observed."""
    run_end = index.latest_end_ns(source, target)
    assert run_end is not None  # the pair is listed, so it has a window
    # A replica no longer observed (it became the write endpoint, it left the config)
    # has no window in the latest run: its old state is history, not health.
    latest = [
        _replica_health(index, source, target, r, run_end)
        for r in replicas
        if index.latest_end_ns(source, target, r) == run_end
    ]
    total = index.summary(source, target, since_ns=run_end)
    seen = [r.last_seen_ns for r in latest if r.last_seen_ns is not None]
    state: PairState = max((r.state for r in latest), key=_STATE_ORDER.index, default="ok")
    return PairHealth(
        source=source,
        target=target,
        state=state,
        recovered_ns=index.recovered_end_ns(source, target) if state != "not_replicating" else None,
        run_end_ns=run_end,
        sent=total.sent,
        lost=total.lost,
        last_seen_ns=max(seen) if seen else None,
        replicas=tuple(latest),
    )


def _replica_health(
    index: LagIndex, source: str, target: str, replica: str, run_end: int
) -> PairHealth:
    latest = index.summary(source, target, since_ns=run_end, replica=replica)
    if latest.sent and not latest.seen:
        state: PairState = "not_replicating"
    elif latest.lost:
        state = "lossy"
    else:
        state = "ok"
    last_seen = run_end if latest.seen else index.last_seen_end_ns(source, target, replica)
    return PairHealth(
        source=source,
        target=target,
        replica=replica,
        state=state,
        run_end_ns=run_end,
        sent=latest.sent,
        lost=latest.lost,
        last_seen_ns=last_seen,
    )


def _pair_problems(pair: PairHealth, *, max_loss: float, now_ns: int) -> list[HealthProblem]:
    where = f"{pair.source}→{pair.target}" + (f" replica {pair.replica}" if pair.replica else "")
    severity: Severity
    if pair.state == "not_replicating":
        seen = (
            f"last probe seen {_ago(now_ns, pair.last_seen_ns)}"
            if pair.last_seen_ns
            else "no probe ever seen"
        )
        kind, severity = "not_replicating", "critical"
        message = (
            f"{where}: none of {pair.sent} probes seen in the latest run "
            f"(reachable, not replicating); {seen}"
        )
    elif pair.sent and pair.lost / pair.sent > max_loss:
        kind, severity = "loss", "warning"
        message = (
            f"{where}: lost {pair.lost}/{pair.sent} probes in the latest run (limit {max_loss:.1%})"
        )
    else:
        return []
    return [_replica_problem(kind, severity, pair.source, pair.target, pair.replica, message)]


def _replica_problem(
    kind: str,
    severity: Severity,
    source: str,
    target: str | None,
    replica: str | None,
    message: str,
) -> HealthProblem:
    """A problem of one replica (or pair) of a source: the one shape every such problem has."""
    return HealthProblem(
        kind=kind,
        severity=severity,
        source=source,
        target=target,
        replica=replica,
        message=message,
    )


def _ago(now_ns: int, then_ns: int) -> str:
    at = datetime.fromtimestamp(then_ns / 1e9, tz=UTC).strftime("%H:%M:%SZ")
    return f"at {at} ({(now_ns - then_ns) / 1e9:.0f} s ago)"


def with_store_problems(verdict: HealthVerdict, store: Store, index: LagIndex) -> HealthVerdict:
    """`verdict` plus what is wrong with the store: writes kept in memory because it cannot
    take them (degraded: probing and alerting go on), or the lag index unable to read it."""
    problems = list(verdict.problems)
    health = store.health
    if health.state != "ok":
        now = time.time_ns()
        since = _ago(now, health.since_ns) if health.since_ns else "now"
        what = "unreachable" if not health.reachable else "full/unwritable"
        spilled = f" ({health.spilled} spilled to disk)" if health.spilled else ""
        problems.append(
            HealthProblem(
                kind="store",
                severity="warning",
                message=f"store {what} since {since}: {health.reason}; "
                f"{health.deferred} writes kept in memory{spilled}, written when it takes them"
                + (f", {health.dropped} dropped" if health.dropped else ""),
            )
        )
    if index.load_error is not None:
        problems.append(
            HealthProblem(
                kind="store",
                severity="warning",
                message=f"lag figures incomplete: the index could not read the store: "
                f"{index.load_error}",
            )
        )
    return HealthVerdict(problems=problems, pairs=verdict.pairs)


def with_replication_problems(
    verdict: HealthVerdict,
    primaries: list[PrimaryState],
    verdicts: dict[str, CheckVerdict],
    *,
    groups: set[str],
    now_ns: int,
    group_verdicts: dict[str, CheckVerdict] | None = None,
) -> HealthVerdict:
    """`verdict` plus what the latest replication sample of each primary and the latest
    check of each replica say: a replica not replicating or a primary unread (critical),
    a writable replica and one found divergent (warnings); and, from each group's latest
    run (`group_verdicts`), keys it could not compare (a warning: not known to be clean)."""
    problems = list(verdict.problems)
    for p in primaries:
        if p.error:
            problems.append(
                HealthProblem(
                    kind="replication",
                    severity="critical",
                    source=p.source,
                    replica=p.primary,
                    message=f"primary {p.primary} ({p.source}) not sampled: {p.error}",
                )
            )
        for r in p.replicas:
            if r.status != "ok":
                how = r.status + (f" for {r.link_down_s} s" if r.link_down_s is not None else "")
                problems.append(
                    _replica_problem(
                        "replication",
                        "critical",
                        p.source,
                        r.region,
                        r.replica,
                        f"replica {r.replica} of {p.primary} ({p.source}) not "
                        f"replicating: {how}" + (f": {r.error}" if r.error else ""),
                    )
                )
            if r.read_only is False:
                problems.append(
                    _replica_problem(
                        "writable",
                        "warning",
                        p.source,
                        r.region,
                        r.replica,
                        f"replica {r.replica} of {p.primary} ({p.source}) is writable "
                        "(replica-read-only no): what clients write there the primary lacks",
                    )
                )
    for name, v in sorted((group_verdicts or {}).items()):
        if v.not_compared and name in groups:
            problems.append(
                HealthProblem(
                    kind="not_compared",
                    severity="warning",
                    group=name,
                    message=f"group {name}: {v.kind} {v.run_id} {v.age_text(now_ns)} ago "
                    f"left {v.not_compared_text()}: not known to be clean",
                )
            )
    for name, v in sorted(verdicts.items()):
        if v.divergent and v.group in groups:
            problems.append(
                HealthProblem(
                    kind="divergence",
                    severity="warning",
                    replica=name,
                    group=v.group,
                    message=f"group {v.group}: replica {name}: {v.describe(now_ns=now_ns)}",
                )
            )
    return HealthVerdict(problems=problems, pairs=verdict.pairs)
