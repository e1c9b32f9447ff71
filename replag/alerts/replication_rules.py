"""Alert rule kinds on replication state (the samples of `replag.replication` in the store).

    replication_bytes_behind  a replica more than `threshold` bytes behind its primary
    replication_headroom      backlog headroom under `threshold` (a fraction of
                              repl-backlog-size): a reconnect would soon mean a full resync
    replication_link_down     a replica's link down (or resyncing, or replicating from
                              elsewhere) for more than `threshold` seconds
    replication_full_resync   a primary served more than `threshold` full resyncs in `over`
    failover_rpo_bytes        the safest failover candidate would lose more than
                              `threshold` bytes (or no replica can be promoted)
    failover_rpo_time         … more than `threshold` of writes (probe p99 lag, link down)

Subjects are the primaries of the current topology that have been sampled; one
whose latest sample is older than `over` has no data, as has a replica that
cannot be read (the unreachable rule reports that) for the per-replica kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

from replag.alerts.condition import Condition, RuleContext
from replag.alerts.config import AlertRule
from replag.plural import count
from replag.replication import history
from replag.replication.check import recent_lag_p99_ms
from replag.replication.check_verdicts import latest_verdicts
from replag.replication.rpo import assess_failover
from replag.replication.sampler import replication_targets
from replag.replication.state import PrimaryState, ReplicaState, human_bytes


def _primaries(rule: AlertRule, ctx: RuleContext) -> list[tuple[PrimaryState, bool]]:
    """(latest sample, fresh) of every sampled primary of a configured source."""
    sources = {r.name for r in ctx.config.topology.regions if r.write is not None}
    # A Sentinel region's primary moves: only its most recent one is a subject.
    latest: dict[str, PrimaryState] = {}
    for p in history.latest_primaries(ctx.store):
        wanted = p.source in sources and rule.source in (None, p.source)
        if wanted and (p.source not in latest or p.sampled_ns > latest[p.source].sampled_ns):
            latest[p.source] = p
    return [(p, p.sampled_ns >= ctx.since_ns(rule)) for p in latest.values()]


def _stale(rule: AlertRule, p: PrimaryState, labels: dict[str, str], what: str) -> Condition:
    """No data: the primary's latest sample is too old, or it could not be read."""
    why = (
        f"{p.primary} could not be read ({p.error})"
        if p.error
        else f"no replication sample of {p.primary} in the last {rule.over_s:g} s"
    )
    return Condition(
        rule=rule, labels=labels, value=None, active=False, no_data=True, summary=f"{what}: {why}"
    )


Judge = Callable[[AlertRule, ReplicaState, dict[str, str], str], Condition]


def _configured_replicas(ctx: RuleContext, primary: PrimaryState) -> list[tuple[str, str]]:
    """(replica, region) expected to replicate from `primary`, from the configuration: the
    subjects of a primary that could not be read (its sample lists no replicas)."""
    sources = [r for r in ctx.config.topology.regions if r.name == primary.source]
    targets, _ = replication_targets(ctx.config.topology, sources=sources)
    return [
        (ep.name, region)
        for t in targets
        for region, ep in t.replicas
        if ep.name != primary.primary  # a Sentinel region's promoted replica
    ]


def _replica_conditions(rule: AlertRule, ctx: RuleContext, judge: Judge) -> list[Condition]:
    out = []
    for primary, fresh in _primaries(rule, ctx):
        if not fresh or primary.error:
            # Every replica's alert goes to no data; none resolves for want of a subject.
            subjects = _configured_replicas(ctx, primary)
            judged: list[tuple[str, str, ReplicaState | None]] = [
                (name, region, None) for name, region in subjects
            ]
        else:
            judged = [(r.replica, r.region, r) for r in primary.replicas]
        for name, region, r in judged:
            if not rule.covers(primary.source, region, name):
                continue
            labels = {"source": primary.source, "region": region, "replica": name}
            where = f"{name} ({region}) of {primary.primary}"
            if r is None:
                out.append(_stale(rule, primary, labels, where))
            else:
                out.append(judge(rule, r, labels, where))
    return out


def _no_data(rule: AlertRule, labels: dict[str, str], summary: str) -> Condition:
    return Condition(
        rule=rule, labels=labels, value=None, active=False, no_data=True, summary=summary
    )


def _bytes_behind(
    rule: AlertRule, r: ReplicaState, labels: dict[str, str], where: str
) -> Condition:
    if r.bytes_behind is None:
        return _no_data(rule, labels, f"{where}: bytes behind unknown ({r.status})")
    return Condition(
        rule=rule,
        labels=labels,
        value=float(r.bytes_behind),
        active=r.bytes_behind > rule.threshold,
        summary=f"{where}: {human_bytes(r.bytes_behind)} behind "
        f"(± {human_bytes(r.bytes_uncertainty)}, limit {human_bytes(rule.threshold)}), "
        f"link {r.status}",
    )


def _headroom(rule: AlertRule, r: ReplicaState, labels: dict[str, str], where: str) -> Condition:
    if r.headroom_fraction is None or r.backlog_headroom is None:
        return _no_data(rule, labels, f"{where}: backlog headroom unknown ({r.status})")
    gone = r.backlog_headroom < 0
    return Condition(
        rule=rule,
        labels=labels,
        value=r.headroom_fraction,
        active=r.headroom_fraction < rule.threshold,
        summary=f"{where}: "
        + (
            f"{human_bytes(-r.backlog_headroom)} it needs are already gone from the "
            "backlog: its reconnect will be a full resync"
            if gone
            else f"backlog headroom {human_bytes(r.backlog_headroom)} "
            f"({r.headroom_fraction:.1%} of the backlog, limit {rule.threshold * 100:g}%): "
            "a longer disconnect means a full resync"
        ),
    )


def _link_down(rule: AlertRule, r: ReplicaState, labels: dict[str, str], where: str) -> Condition:
    if r.status == "unreachable":
        return _no_data(rule, labels, f"{where}: cannot be read ({r.error})")
    down = r.status != "ok"
    seconds = float(r.link_down_s or 0) if down else 0.0
    detail = r.error or f"link {r.link_status or 'down'}"
    if r.link_down_s is not None:
        detail += f" for {r.link_down_s} s"
    return Condition(
        rule=rule,
        labels=labels,
        value=seconds if down else 0.0,
        active=down and seconds >= rule.threshold,
        summary=f"{where}: {r.status}: {detail}" if down else f"{where}: link up",
    )


def bytes_behind_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    return _replica_conditions(rule, ctx, _bytes_behind)


def headroom_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    return _replica_conditions(rule, ctx, _headroom)


def link_down_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    return _replica_conditions(rule, ctx, _link_down)


def full_resync_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    """Growth of a primary's `sync_full` within `over` (a restart resets it: counted anew)."""
    out = []
    since = ctx.since_ns(rule)
    for primary, fresh in _primaries(rule, ctx):
        labels = {"source": primary.source, "primary": primary.primary}
        if not fresh or primary.error:  # an unread primary's counter is unknown, not 0
            out.append(_stale(rule, primary, labels, f"primary {primary.primary}"))
            continue
        rows = ctx.store.execute(
            """SELECT sync_full FROM replication_primaries
               WHERE source = ? AND primary_name = ? AND sync_full IS NOT NULL AND sampled_ns >= (
                   SELECT COALESCE(MAX(sampled_ns), 0) FROM replication_primaries
                   WHERE source = ? AND primary_name = ? AND sampled_ns < ?)
               ORDER BY sampled_ns""",
            (primary.source, primary.primary, primary.source, primary.primary, since),
        )
        counts = [int(r[0]) for r in rows]
        grew = sum(b - a if b >= a else b for a, b in pairwise(counts))
        out.append(
            Condition(
                rule=rule,
                labels=labels,
                value=float(grew),
                active=grew > rule.threshold,
                summary=f"primary {primary.primary} ({primary.source}) served "
                f"{count(grew, 'full resync')} in the last {rule.over_s:g} s "
                f"(limit {rule.threshold:g}): "
                + (
                    "a replica fell out of the backlog or reconnected without history"
                    if grew
                    else "none"
                ),
            )
        )
    return out


def _rpo_conditions(rule: AlertRule, ctx: RuleContext, *, in_time: bool) -> list[Condition]:
    out = []
    for primary, fresh in _primaries(rule, ctx):
        labels = {"source": primary.source, "primary": primary.primary}
        if not fresh or primary.error:
            out.append(_stale(rule, primary, labels, f"primary {primary.primary}"))
            continue
        lag = recent_lag_p99_ms(
            ctx.store, primary.source, now_ns=ctx.now_ns, freshness_s=max(rule.over_s, 300.0)
        )
        assessment = assess_failover(
            primary, lag_p99_ms=lag, verdicts=latest_verdicts(ctx.store), now_ns=ctx.now_ns
        )
        best = assessment.safest
        where = f"failover of {primary.primary} ({primary.source})"
        if best is None:
            out.append(
                Condition(
                    rule=rule,
                    labels=labels,
                    value=None,
                    active=True,
                    summary=f"{where}: {assessment.verdict}",
                )
            )
            continue
        value = best.rpo_s if in_time else best.rpo_bytes
        if value is None:
            out.append(_no_data(rule, labels, f"{where}: {best.replica}'s RPO unknown"))
            continue
        limit = f"{rule.threshold * 1000:g} ms" if in_time else human_bytes(rule.threshold)
        loss = f"{value * 1000:.1f} ms of writes" if in_time else human_bytes(value)
        out.append(
            Condition(
                rule=rule,
                labels=labels,
                value=float(value),
                active=value > rule.threshold,
                summary=f"{where}: the safest candidate {best.replica} would lose {loss} "
                f"(limit {limit})" + (f", from {best.rpo_s_from}" if in_time else ""),
            )
        )
    return out


def rpo_bytes_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    return _rpo_conditions(rule, ctx, in_time=False)


def rpo_time_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    return _rpo_conditions(rule, ctx, in_time=True)
