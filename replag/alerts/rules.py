"""Evaluating alert rules against the store: one `Condition` per rule and subject.

A subject is what an alert is about (a region pair, a replica, a group, a
Dynomite node); its labels plus the rule name make the alert's fingerprint, so
the same problem is one alert however often it is evaluated.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from itertools import pairwise

from replag.alerts.config import AlertRule
from replag.alerts.health import group_health, probe_health
from replag.config import Config
from replag.durations import format_ms
from replag.lagindex import LagIndex
from replag.monitoring.dynomite_stats import (
    DroppedWrites,
    DynomiteStats,
    dropped_writes,
    ensure_stats_schema,
    recent_stats,
)
from replag.store import Store

# Samples per node the dropped-writes rule reads at most: a week of `over` at a 10 s
# interval would be 60k; beyond this the growth counts over the most recent samples only.
MAX_STATS_SAMPLES = 2000


@dataclass(frozen=True, kw_only=True)
class Condition:
    rule: AlertRule
    labels: dict[str, str] = field(default_factory=dict)
    active: bool
    value: float | None
    summary: str

    @property
    def all_labels(self) -> dict[str, str]:
        return {
            "alertname": self.rule.name,
            "kind": self.rule.kind,
            "severity": self.rule.severity,
            **self.labels,
        }

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.rule.name, self.labels)


def fingerprint(rule_name: str, labels: dict[str, str]) -> str:
    text = json.dumps([rule_name, sorted(labels.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def evaluate_rules(config: Config, index: LagIndex, *, now_ns: int) -> list[Condition]:
    """Every rule's current conditions (active or not) for every subject it covers."""
    out: list[Condition] = []
    for rule in config.alerts.rules:
        if rule.kind in ("lag_p99", "probe_loss"):
            out += _lag_conditions(rule, index, now_ns=now_ns)
        elif rule.kind == "divergent_keys":
            out += _divergence_conditions(rule, config, index)
        elif rule.kind == "unreachable":
            out += _unreachable_conditions(rule, config, index)
        elif rule.kind == "dynomite_dropped_writes":
            out += _dropped_write_conditions(rule, index.store, now_ns=now_ns)
        else:
            out += _no_probe_conditions(rule, config, index, now_ns=now_ns)
    return out


def _lag_conditions(rule: AlertRule, index: LagIndex, *, now_ns: int) -> list[Condition]:
    since = now_ns - int(rule.over_s * 1e9)
    out = []
    for source, target in index.pairs(since_ns=since):
        if rule.source not in (None, source) or rule.target not in (None, target):
            continue
        summary = index.summary(source, target, since_ns=since)
        labels = {"source": source, "target": target}
        if rule.kind == "lag_p99":
            p99 = summary.lag_ms["p99"]
            out.append(
                Condition(
                    rule=rule,
                    labels=labels,
                    value=p99,
                    active=p99 is not None and p99 > rule.threshold,
                    summary=f"{source}→{target}: p99 lag {format_ms(p99)} ms over the last "
                    f"{rule.over_s:g} s (limit {format_ms(rule.threshold)} ms)",
                )
            )
        else:
            ratio = summary.loss_ratio
            out.append(
                Condition(
                    rule=rule,
                    labels=labels,
                    value=ratio,
                    active=summary.sent > 0 and ratio > rule.threshold,
                    summary=f"{source}→{target}: lost {summary.lost}/{summary.sent} probes "
                    f"({ratio:.2%}, limit {rule.threshold:.2%})",
                )
            )
    return out


def _divergence_conditions(rule: AlertRule, config: Config, index: LagIndex) -> list[Condition]:
    """Groups of the current topology, by their last successful check.

    A failed latest check leaves the alert as it was (the unreachable rule reports
    the failure); a group removed from the config has no condition, so its alert
    resolves.
    """
    groups = {g.name for g in config.topology.groups}
    out = []
    for name, health in group_health(index.store).items():
        if name not in groups or rule.group not in (None, name) or health.divergent is None:
            continue
        failed = f"; the latest check failed: {health.error}" if health.error else ""
        out.append(
            Condition(
                rule=rule,
                labels={"group": name},
                value=float(health.divergent),
                active=health.divergent > rule.threshold,
                summary=f"replica group {name}: {health.divergent} divergent keys "
                f"(check {health.run_id or '-'}{failed})",
            )
        )
    return out


def _unreachable_conditions(rule: AlertRule, config: Config, index: LagIndex) -> list[Condition]:
    """Replicas the latest probe from each current source could not reach."""
    sources = {r.name for r in config.topology.regions if r.write is not None}
    out = []
    for source, health in probe_health(index.store).items():
        if source not in sources or rule.source not in (None, source):
            continue
        for item in health.unreachable:
            region, replica = item.get("region", ""), item.get("replica", "")
            if rule.target not in (None, region):
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


def _no_probe_conditions(
    rule: AlertRule, config: Config, index: LagIndex, *, now_ns: int
) -> list[Condition]:
    health = probe_health(index.store)
    last_window = dict(
        index.store.execute("SELECT source, MAX(end_ns) FROM lag_windows GROUP BY source")
    )
    out = []
    for region in config.topology.regions:
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
        age_s = (now_ns - max(seen)) / 1e9 if seen else None
        out.append(
            Condition(
                rule=rule,
                labels={"source": region.name},
                value=age_s,
                active=age_s is None or age_s > rule.threshold,
                summary=(
                    f"no successful probe from {region.name} for {age_s:.0f} s "
                    f"(limit {rule.threshold:g} s)"
                    if age_s is not None
                    else f"no successful probe from {region.name} yet"
                ),
            )
        )
    return out


def _dropped_write_conditions(rule: AlertRule, store: Store, *, now_ns: int) -> list[Condition]:
    """One condition per Dynomite node whose dropped peer requests grew within `over`.

    The alert resolves once no sample within `over` shows growth.
    """
    out = []
    for found in dropped_writes_since(store, since_ns=now_ns - int(rule.over_s * 1e9)):
        where = f"Dynomite node {found.node} (DC {found.dc}, rack {found.rack})"
        active = found.dropped > rule.threshold
        out.append(
            Condition(
                rule=rule,
                labels={"node": found.node, "dc": found.dc, "rack": found.rack},
                value=float(found.dropped),
                active=active,
                summary=(
                    f"{where}: {found.dropped} peer requests dropped ({found.timed_out} timed "
                    f"out) in the last {rule.over_s:g} s: {found.message}"
                    if active
                    else f"{where}: {found.dropped} peer requests dropped in the last "
                    f"{rule.over_s:g} s (limit {rule.threshold:g})"
                ),
            )
        )
    return out


def dropped_writes_since(store: Store, *, since_ns: int) -> list[DroppedWrites]:
    """Dynomite nodes whose dropped peer requests grew from `since_ns` on, with how much.

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
                    since_ns=findings[0].since_ns,
                )
            )
    return out


def _samples_since(store: Store, *, since_ns: int) -> dict[str, list[DynomiteStats]]:
    """Each node's samples from `since_ns` on, after the last one before it (the baseline).

    Nodes with no sample since then are left out: a node that stopped answering is
    the collector's error to report, not evidence of dropped writes.
    """
    ensure_stats_schema(store)
    rows = store.execute(
        "SELECT MAX(n) FROM (SELECT COUNT(*) AS n FROM dynomite_stats WHERE sampled_ns >= ? "
        "GROUP BY node)",
        (since_ns,),
    )
    newest = rows[0][0] if rows else None
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
