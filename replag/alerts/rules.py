"""Evaluating alert rules against the store: one `Condition` per rule and subject.

A subject is what an alert is about (a region pair, a replica, a group, a
Dynomite node); its labels plus the rule name make the alert's fingerprint, so
the same problem is one alert however often it is evaluated. A condition is
active (the rule's limit is crossed), inactive, or has no data: the subject is
still there but nothing measured it (every probe lost, no probe sent, the
check failed, the node silent). What no data does to an alert is the rule's
`no_data` (`replag.alerts.state`); it never counts as "inactive" by itself.

Each rule kind is one function in `RULE_KINDS` taking the rule and a
`RuleContext`; a new kind is one more entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise

from replag.alerts import replication_rules
from replag.alerts.condition import Condition, RuleContext, RuleKind, fingerprint
from replag.alerts.config import AlertRule
from replag.alerts.health import group_health, probe_health
from replag.config import Config
from replag.durations import format_ms
from replag.errors import StoreUnwritable
from replag.lagindex import LagIndex
from replag.monitoring.dropped_writes import DROPPED_WRITES_MESSAGE, DroppedWrites, dropped_writes
from replag.monitoring.dynomite_figures import DynomiteStats
from replag.monitoring.dynomite_stats import recent_stats
from replag.settings import Settings
from replag.store import Store

# Samples per node the dropped-writes rule reads at most: a week of `over` at a 10 s
# interval would be 60k; beyond this the growth counts over the most recent samples only.
MAX_STATS_SAMPLES = 2000


def evaluate_rules(
    config: Config, index: LagIndex, *, now_ns: int, unknown: set[str] | None = None
) -> list[Condition]:
    """Every rule's current conditions (active, inactive or no data) for every subject.

    A rule that needs the store while it cannot be read (PostgreSQL away) has no
    conditions this time: with `unknown`, its name is added there (its alerts then stay
    as they are) and the other rules, which read what is in memory, go on; without it,
    the error is raised."""
    ctx = RuleContext(config=config, index=index, now_ns=now_ns)
    out: list[Condition] = []
    for rule in config.alerts.rules:
        try:
            out += RULE_KINDS[rule.kind](rule, ctx)
        except StoreUnwritable:
            if unknown is None:
                raise
            unknown.add(rule.name)
    return out


def _lag_replicas(rule: AlertRule, ctx: RuleContext) -> list[tuple[str, str, str]]:
    """Replicas measured within `over`, and replicas measured before whose source still
    probes and whose target is still configured (they have no data now: that is news
    too). Each replica is its own subject: a region's other replicas never hide it."""
    regions = ctx.config.topology.regions
    sources = {r.name for r in regions if r.write is not None}
    targets = {r.name for r in regions}
    recent = set(ctx.index.replicas(since_ns=ctx.since_ns(rule)))
    known = {(s, t, r) for s, t, r in ctx.index.replicas() if s in sources and t in targets}
    return sorted(k for k in recent | known if rule.covers(*k))


def _where(source: str, target: str, replica: str) -> str:
    return f"{source}→{target} replica {replica}"


def lag_p99_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    """p99 lag of each replica over the windows of the last `over` against `threshold` (ms).

    No sample seen in that range (every probe lost, or none sent) is no data: a
    partitioned replica has no p99, which is not a healthy one.
    """
    out = []
    for source, target, replica in _lag_replicas(rule, ctx):
        summary = ctx.index.summary(source, target, since_ns=ctx.since_ns(rule), replica=replica)
        labels = {"source": source, "target": target, "replica": replica}
        where = _where(source, target, replica)
        p99 = summary.lag_ms["p99"]
        if p99 is None:
            out.append(
                Condition(
                    rule=rule,
                    labels=labels,
                    value=None,
                    active=False,
                    no_data=True,
                    summary=f"{where}: no lag measured in the last {rule.over_s:g} s: "
                    + (
                        f"all {summary.sent} probes lost"
                        if summary.sent
                        else f"no probe sent from {source}"
                    ),
                )
            )
            continue
        out.append(
            Condition(
                rule=rule,
                labels=labels,
                value=p99,
                active=p99 > rule.threshold,
                summary=f"{where}: p99 lag {format_ms(p99)} ms over the last "
                f"{rule.over_s:g} s (limit {format_ms(rule.threshold)} ms)",
            )
        )
    return out


def probe_loss_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    """Each replica's lost/sent over the last `over` against `threshold` (a ratio); no probe
    sent is no data."""
    out = []
    for source, target, replica in _lag_replicas(rule, ctx):
        summary = ctx.index.summary(source, target, since_ns=ctx.since_ns(rule), replica=replica)
        labels = {"source": source, "target": target, "replica": replica}
        where = _where(source, target, replica)
        ratio = summary.loss_ratio
        if not summary.sent:
            out.append(
                Condition(
                    rule=rule,
                    labels=labels,
                    value=None,
                    active=False,
                    no_data=True,
                    summary=f"{where}: no probe sent from {source} in the last {rule.over_s:g} s",
                )
            )
            continue
        out.append(
            Condition(
                rule=rule,
                labels=labels,
                value=ratio,
                active=ratio > rule.threshold,
                summary=f"{where}: lost {summary.lost}/{summary.sent} probes "
                f"({ratio:.2%}, limit {rule.threshold:.2%})",
            )
        )
    return out


def divergent_keys_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    """Groups of the current topology, by their last successful check.

    A failed latest check is no data (the unreachable rule reports the failure); its
    value is the last successful count. A group removed from the config has no
    condition, so its alert resolves.
    """
    groups = {g.name for g in ctx.config.topology.groups}
    out = []
    for name, health in group_health(ctx.store).items():
        if name not in groups or rule.group not in (None, name):
            continue
        value = None if health.divergent is None else float(health.divergent)
        found = f"{health.divergent} divergent keys" if value is not None else "never checked"
        failed = f"; the latest check failed: {health.error}" if health.error else ""
        out.append(
            Condition(
                rule=rule,
                labels={"group": name},
                value=value,
                active=not health.error and value is not None and value > rule.threshold,
                no_data=bool(health.error),
                summary=f"replica group {name}: {found} (check {health.run_id or '-'}{failed})",
            )
        )
    return out


def unreachable_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    """Replicas the latest probe from each current source could not reach."""
    sources = {r.name for r in ctx.config.topology.regions if r.write is not None}
    out = []
    for source, health in probe_health(ctx.store).items():
        if source not in sources or rule.source not in (None, source):
            continue
        for item in health.unreachable:
            region, replica = item.get("region", ""), item.get("replica", "")
            if not rule.covers(source, region, replica):
                continue
            out.append(
                Condition(
                    rule=rule,
                    labels={"source": source, "region": region, "replica": replica},
                    value=1.0,
                    active=True,
                    summary=f"replica {replica} in {region} unreachable from {source}: "
                    f"{item.get('error', 'no answer')}",
                )
            )
    return out


def no_probe_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    """Sources without a successful probe for `threshold` seconds (or ever)."""
    health = probe_health(ctx.store)
    last_window: dict[str, int] = {
        r.source: r.last_end_ns
        for r in ctx.store.execute(
            "SELECT source, MAX(end_ns) AS last_end_ns FROM lag_windows GROUP BY source",
            last_known=True,
        )
    }
    out = []
    for region in ctx.config.topology.regions:
        if region.write is None or rule.source not in (None, region.name):
            continue
        seen = [
            t
            for t in (
                last_window.get(region.name),
                getattr(health.get(region.name), "last_success_ns", None),
            )
            if t
        ]
        if not seen and region.name not in health:
            continue  # never attempted: nothing to say yet
        age_s = (ctx.now_ns - max(seen)) / 1e9 if seen else None
        # Why, when the last attempt failed (a Sentinel naming a host outside
        # allow_networks, say: that host, not contacted, is named here).
        error = getattr(health.get(region.name), "error", None)
        why = f"; the last attempt failed: {error}" if error else ""
        out.append(
            Condition(
                rule=rule,
                labels={"source": region.name},
                value=age_s,
                active=age_s is None or age_s > rule.threshold,
                summary=(
                    f"no successful probe from {region.name} for {age_s:.0f} s "
                    f"(limit {rule.threshold:g} s){why}"
                    if age_s is not None
                    else f"no successful probe from {region.name} yet{why}"
                ),
            )
        )
    return out


def dynomite_dropped_writes_conditions(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    """Dynomite writes that did not reach every replica, from both sides:

    - per node (labels node, dc, rack), from its /info: peer links that closed, were
      refused or timed out, plus requests dropped from a closing link, within `over`
      (under DC_ONE a write for a peer without a link is dropped and counted nowhere);
    - per rack (labels source, region, replica), from replag's own probes through a
      Dynomite client port: probe writes acknowledged but never seen on that rack's
      reachable backend within `over`.

    Either resolves once a whole `over` passes without. A configured node with no
    sample within `over` (its /info does not answer) has no data.
    """
    out = []
    settings = ctx.config.settings
    nodes = settings.dynomite_stats_urls
    findings = dropped_writes_since(
        ctx.store, since_ns=ctx.since_ns(rule), nodes=nodes, stale_after_s=stale_after_s(settings)
    )
    for found in findings:
        where = f"Dynomite node {found.node} (DC {found.dc}, rack {found.rack})"
        active = found.events > rule.threshold
        out.append(
            Condition(
                rule=rule,
                labels={"node": found.node, "dc": found.dc, "rack": found.rack},
                value=float(found.events),
                active=active,
                summary=(
                    f"{where}: {found.describe()} in the last {rule.over_s:g} s: {found.message}"
                    if active
                    else f"{where}: {found.describe()} in the last {rule.over_s:g} s "
                    f"(limit {rule.threshold:g})"
                ),
            )
        )
    out += _dynomite_probe_loss(rule, ctx)
    urls = set(ctx.config.settings.dynomite_stats_urls)
    found_on = {f.node for f in findings}
    for last in recent_stats(ctx.store, limit=1):
        if (
            last.node in urls
            and last.sampled_ns >= ctx.since_ns(rule)
            and last.node not in found_on
        ):
            # Answering, and nothing dropped within `over`: said so, so that an alert of
            # this node resolves for that reason, not as if it had left the config.
            where = f"Dynomite node {last.node} (DC {last.dc}, rack {last.rack})"
            out.append(
                Condition(
                    rule=rule,
                    labels={"node": last.node, "dc": last.dc, "rack": last.rack},
                    value=0.0,
                    active=False,
                    summary=f"{where}: no peer link failure or dropped request in the last "
                    f"{rule.over_s:g} s",
                )
            )
        if last.node in urls and last.sampled_ns < ctx.since_ns(rule):
            where = f"Dynomite node {last.node} (DC {last.dc}, rack {last.rack})"
            out.append(
                Condition(
                    rule=rule,
                    labels={"node": last.node, "dc": last.dc, "rack": last.rack},
                    value=None,
                    active=False,
                    no_data=True,
                    summary=f"{where}: no /info sample in the last {rule.over_s:g} s",
                )
            )
    return out


def _dynomite_probe_loss(rule: AlertRule, ctx: RuleContext) -> list[Condition]:
    """Racks that missed probe writes acknowledged by a Dynomite client port within `over`."""
    dynomite = {
        r.name for r in ctx.config.topology.regions if r.write and r.write.kind == "dynomite"
    }
    if not dynomite:
        return []
    rows = ctx.store.execute(
        "SELECT source, target, replica, SUM(sent) AS sent, SUM(lost) AS lost FROM lag_windows "
        "WHERE end_ns >= ? GROUP BY source, target, replica ORDER BY source, target, replica",
        (ctx.since_ns(rule),),
    )
    out = []
    listed = set()
    for source, target, replica, sent, lost in (
        (r.source, r.target, r.replica, int(r.sent), int(r.lost)) for r in rows
    ):
        if source not in dynomite or not rule.covers(source, target, replica):
            continue
        listed.add((source, target, replica))
        if not lost:
            out.append(
                Condition(
                    rule=rule,
                    labels={"source": source, "region": target, "replica": replica},
                    value=0.0,
                    active=False,
                    summary=f"{replica} ({target}) saw all {sent} probe writes Dynomite "
                    f"acknowledged in {source} in the last {rule.over_s:g} s",
                )
            )
            continue
        out.append(
            Condition(
                rule=rule,
                labels={"source": source, "region": target, "replica": replica},
                value=float(lost),
                active=lost > rule.threshold,
                summary=f"{replica} ({target}) missed {lost} of {sent} probe writes Dynomite "
                f"acknowledged in {source} in the last {rule.over_s:g} s: "
                f"{DROPPED_WRITES_MESSAGE}",
            )
        )
    topology = ctx.config.topology
    for region in topology.regions:
        if region.name not in dynomite or region.write is None:
            continue
        for target, ep in topology.reached_from(region, region.write)[0]:
            key = (region.name, target.name, ep.name)
            if key in listed or not rule.covers(*key):
                continue
            out.append(
                Condition(
                    rule=rule,
                    labels={"source": region.name, "region": target.name, "replica": ep.name},
                    value=0.0,
                    active=False,
                    summary=f"{ep.name} ({target.name}): no probe write through {region.name} "
                    f"in the last {rule.over_s:g} s, none missed",
                )
            )
    return out


def stale_after_s(settings: Settings) -> float:
    """How much older than the newest /info sample a node's last one may be and still be
    of the same collection round: the nodes of a round are read at once, each within
    connect_timeout; a node that missed a round is a probe_interval behind."""
    return min(settings.connect_timeout, settings.probe_interval / 2)


def dropped_writes_since(
    store: Store,
    *,
    since_ns: int,
    nodes: Sequence[str] = (),
    stale_after_s: float | None = None,
) -> list[DroppedWrites]:
    """Dynomite nodes whose peer links failed or dropped requests from `since_ns` on, each
    naming its peers among `nodes` (the configured stats URLs) that are down: no /info
    sample since then, or (`stale_after_s` given) none in the latest collection round, so
    a peer down for less than `over` is named while it is down.

    Growth is summed over consecutive stored samples, so a restart or Dynomite's
    periodic counter reset in between is not mistaken for a drop to zero.
    """
    out = []
    for samples in _samples_since(store, since_ns=since_ns).values():
        pairs = [(a, b) for a, b in pairwise(samples) if b.sampled_ns >= since_ns]
        findings = [f for a, b in pairs if (f := dropped_writes(a, b)) is not None]
        if findings:
            out.append(
                replace(
                    findings[-1],
                    dropped=sum(f.dropped for f in findings),
                    timed_out=sum(f.timed_out for f in findings),
                    link_failures=sum(f.link_failures for f in findings),
                    since_ns=findings[0].since_ns,
                )
            )
    down = _nodes_down(store, since_ns=since_ns, nodes=nodes, stale_after_s=stale_after_s)
    down = down if out else {}
    return [
        replace(f, peers_down=tuple(label for node, label in down.items() if node != f.node))
        for f in out
    ]


def _nodes_down(
    store: Store, *, since_ns: int, nodes: Sequence[str], stale_after_s: float | None = None
) -> dict[str, str]:
    """Configured nodes with no /info sample since `since_ns`, or (`stale_after_s`) none in
    the newest collection round → "dc/rack (node)" as last seen."""
    last = {s.node: s for s in recent_stats(store, limit=1)}
    newest = max((s.sampled_ns for s in last.values()), default=0)
    behind_ns = int(stale_after_s * 1e9) if stale_after_s is not None else None
    down = {}
    for node in nodes:
        sample = last.get(node)
        if sample is None:
            down[node] = f"{node} (never answered)"
        elif sample.sampled_ns < since_ns or (
            behind_ns is not None and sample.sampled_ns < newest - behind_ns
        ):
            down[node] = f"{sample.dc}/{sample.rack} ({node})"
    return down


def _samples_since(store: Store, *, since_ns: int) -> dict[str, list[DynomiteStats]]:
    """Each node's samples from `since_ns` on, after the last one before it (the baseline).

    Nodes with no sample since then are left out: a node that stopped answering is
    the collector's error to report, not evidence of dropped writes.
    """
    rows = store.execute(
        "SELECT MAX(n) AS most FROM (SELECT COUNT(*) AS n FROM dynomite_stats "
        "WHERE sampled_ns >= ? GROUP BY node) AS per_node",
        (since_ns,),
    )
    newest = rows[0].most if rows else None
    if not newest:
        return {}
    by_node: dict[str, list[DynomiteStats]] = {}
    for sample in recent_stats(store, limit=min(newest + 1, MAX_STATS_SAMPLES)):
        by_node.setdefault(sample.node, []).append(sample)
    out = {}
    for node, samples in by_node.items():
        first = next((i for i, s in enumerate(samples) if s.sampled_ns >= since_ns), None)
        if first is not None:
            out[node] = samples[max(0, first - 1) :]
    return out


RULE_KINDS: dict[str, RuleKind] = {
    "lag_p99": lag_p99_conditions,
    "probe_loss": probe_loss_conditions,
    "divergent_keys": divergent_keys_conditions,
    "unreachable": unreachable_conditions,
    "no_probe": no_probe_conditions,
    "dynomite_dropped_writes": dynomite_dropped_writes_conditions,
    "replication_bytes_behind": replication_rules.bytes_behind_conditions,
    "replication_headroom": replication_rules.headroom_conditions,
    "replication_link_down": replication_rules.link_down_conditions,
    "replication_full_resync": replication_rules.full_resync_conditions,
    "failover_rpo_bytes": replication_rules.rpo_bytes_conditions,
    "failover_rpo_time": replication_rules.rpo_time_conditions,
}

__all__ = ["RULE_KINDS", "Condition", "RuleContext", "RuleKind", "evaluate_rules", "fingerprint"]
