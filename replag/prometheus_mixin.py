"""replag's Prometheus mixin: recording and alerting rules, as code, thresholds as parameters.

`python -m replag.prometheus_mixin` writes `deploy/prometheus/replag-recording-rules.yml`
and `replag-alerting-rules.yml` for the default `MixinParams`; `--set NAME=VALUE` overrides
a parameter, `--check` writes nothing and exits 1 naming each stale file. The alerts mirror
the built-in rule kinds (`replag.alerts.config.RuleKind`), plus multi-window,
multi-burn-rate alerts for a lag SLO (the SRE workbook's, chapter 5), and every one links
to its section of the docs' runbook page (`docs/runbooks/prometheus-alerts.md`).
Every metric a rule reads is one `replag serve` exports (a test checks).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from replag.metrics import LAG_BUCKETS_S

Rule = dict[str, Any]

RECORDING_FILE = "replag-recording-rules.yml"
ALERTING_FILE = "replag-alerting-rules.yml"
RUNBOOK_PAGE = "runbooks/prometheus-alerts/"
# The SRE workbook's multi-window, multi-burn-rate table (for a 30-day budget):
# (long window, short window, burn rate, page or ticket).
BURN_WINDOWS = (
    ("1h", "5m", 14.4, "page"),
    ("6h", "30m", 6.0, "page"),
    ("1d", "2h", 3.0, "ticket"),
    ("3d", "6h", 1.0, "ticket"),
)
PAIR = "source, target"
REPLICA = "source, target, replica, rack"
REPLICATION = "source, primary, region, replica"
# Label matchers (kept out of f-strings: Python 3.11 allows no quote reuse there).
TASK_PROBE = 'task="probe"'
FULL = 'kind="full"'
FAILED = 'outcome="failed"'
CHECK_ERROR = 'action="check", outcome="error"'
CHECK_OK = 'action="check", outcome!="error"'


@dataclass(frozen=True, kw_only=True)
class MixinParams:
    """Every threshold, window and label of the rules; the defaults are the built-in rule
    kinds' defaults (`replag.alerts.tables.DEFAULT_THRESHOLD`) where one exists."""

    selector: str = 'job="replag"'
    runbook_base: str = "https://replag.example.com/docs"
    rate_window: str = "5m"
    lag_p99_limit_s: float = 0.5
    lag_for: str = "5m"
    lag_severity: str = "warning"
    probe_loss_ratio: float = 0.01
    probe_loss_for: str = "5m"
    not_replicating_ratio: float = 0.99
    not_replicating_window: str = "2m"
    not_replicating_for: str = "1m"
    unreachable_for: str = "2m"
    link_down_for: str = "30s"
    bytes_behind_limit: int = 1 << 20
    bytes_behind_for: str = "1m"
    headroom_ratio: float = 0.25
    headroom_for: str = "1m"
    full_resync_over: str = "15m"
    rpo_bytes_limit: int = 1 << 20
    rpo_seconds_limit: float = 1.0
    rpo_for: str = "1m"
    no_probe_s: float = 600.0
    dynomite_dropped_over: str = "5m"
    check_failing_over: str = "1h"
    store_degraded_for: str = "5m"
    delivery_failing_over: str = "15m"
    absent_for: str = "5m"
    slo_lag_s: float = 1.0
    slo_objective: float = 0.99

    def __post_init__(self) -> None:
        if self.slo_lag_s not in LAG_BUCKETS_S:
            near = min(LAG_BUCKETS_S, key=lambda b: abs(b - self.slo_lag_s))
            raise ValueError(
                f"slo_lag_s={self.slo_lag_s:g} is not a bound of replag_lag_seconds "
                f"(the nearest is {near:g}): the SLO counts a bucket, not an estimate"
            )
        if not 0 < self.slo_objective < 1:
            raise ValueError(f"slo_objective is between 0 and 1, got {self.slo_objective:g}")


def _num(x: float) -> str:
    """A number as PromQL and people read it (0.01, not 0.010000000000000009)."""
    return f"{x:.10g}"


def _le(bound: float) -> str:
    """A regex for the `le` label of `bound`: exporters write 1 or 1.0, Prometheus 3 stores
    the float form."""
    text = _num(bound)
    forms = {text, f"{text}.0"} if "." not in text else {text}
    return "|".join(re.escape(f).replace("\\", "\\\\") for f in sorted(forms))


class _Builder:
    def __init__(self, p: MixinParams) -> None:
        self.p = p

    def m(self, name: str, extra: str = "") -> str:
        """A selector for one of replag's series."""
        return f"{name}{{{', '.join(x for x in (self.p.selector, extra) if x)}}}"

    def alert(
        self,
        name: str,
        expr: str,
        *,
        severity: str,
        summary: str,
        description: str,
        for_: str | None = None,
    ) -> Rule:
        rule: Rule = {"alert": name, "expr": expr}
        if for_ and for_ != "0s":
            rule["for"] = for_
        rule["labels"] = {"severity": severity}
        rule["annotations"] = {
            "summary": summary,
            "description": description,
            "runbook_url": f"{self.p.runbook_base.rstrip('/')}/{RUNBOOK_PAGE}#{name.lower()}",
        }
        return rule

    # --- recording ----------------------------------------------------------

    def recording(self) -> list[dict[str, Any]]:
        w = self.p.rate_window
        lag = self.m("replag_lag_seconds_bucket")
        sent = self.m("replag_probes_sent_total")
        lost = self.m("replag_probes_lost_total")
        rules: list[Rule] = []
        for level, by in (("replica", REPLICA), ("pair", PAIR)):
            for q, tag in ((0.5, "p50"), (0.99, "p99"), (0.999, "p999")):
                rules.append(
                    {
                        "record": f"{level}:replag_lag_seconds:{tag}_rate{w}",
                        "expr": f"histogram_quantile({q}, sum by (le, {by}) (rate({lag}[{w}])))",
                    }
                )
            rules.append(
                {
                    "record": f"{level}:replag_probes_lost:ratio_rate{w}",
                    "expr": f"sum by ({by}) (rate({lost}[{w}]))\n"
                    f"/\nsum by ({by}) (rate({sent}[{w}]))",
                }
            )
        # Several instances may export the same gauge (one store, leases): max/min over
        # them, never a sum.
        rules += [
            {
                "record": "replica:replag_replication_offset_lag_bytes:max",
                "expr": f"max by ({REPLICATION}) ({self.m('replag_replication_offset_lag_bytes')})",
            },
            {
                "record": "primary:replag_replication_offset_lag_bytes:max",
                "expr": f"max by (source, primary) "
                f"({self.m('replag_replication_offset_lag_bytes')})",
            },
            {
                "record": "replica:replag_replication_backlog_headroom_ratio:min",
                "expr": f"min by ({REPLICATION}) "
                f"({self.m('replag_replication_backlog_headroom_ratio')})",
            },
            {
                "record": "primary:replag_replication_backlog_headroom_bytes:min",
                "expr": f"min by (source, primary) "
                f"({self.m('replag_replication_backlog_headroom_bytes')})",
            },
            {
                # The safest failover candidate: what the best replica would lose.
                "record": "primary:replag_replication_rpo_bytes:min",
                "expr": f"min by (source, primary) ({self.m('replag_replication_rpo_bytes')})",
            },
            {
                "record": "primary:replag_replication_rpo_seconds:min",
                "expr": f"min by (source, primary) ({self.m('replag_replication_rpo_seconds')})",
            },
            {
                "record": "group:replag_divergent_keys:max",
                "expr": f"max by (group) ({self.m('replag_divergent_keys')})",
            },
            {
                "record": "group:replag_check_errors:increase" + self.p.check_failing_over,
                "expr": f"sum by (group) (increase("
                f"{self.m('replag_repair_runs_total', CHECK_ERROR)}"
                f"[{self.p.check_failing_over}]))",
            },
            {
                "record": "group:replag_checks_ok:increase" + self.p.check_failing_over,
                "expr": f"sum by (group) (increase("
                f"{self.m('replag_repair_runs_total', CHECK_OK)}"
                f"[{self.p.check_failing_over}]))",
            },
        ]
        return [
            {"name": "replag.recording", "rules": rules},
            {"name": "replag.slo.recording", "rules": self.slo_recording()},
        ]

    def slo_recording(self) -> list[Rule]:
        """The lag SLO's error ratio per pair: probes lost or seen later than `slo_lag_s`,
        over probes sent, for every window the burn-rate alerts read."""
        windows = sorted({w for pair in BURN_WINDOWS for w in pair[:2]}, key=_seconds)
        good = self.m("replag_lag_seconds_bucket", f'le=~"{_le(self.p.slo_lag_s)}"')
        sent = self.m("replag_probes_sent_total")
        return [
            {
                "record": f"pair:replag_lag_slo_errors:ratio_rate{w}",
                "expr": f"clamp_min(1 - (\n  sum by ({PAIR}) (rate({good}[{w}]))\n  /\n"
                f"  sum by ({PAIR}) (rate({sent}[{w}]))\n), 0)",
                "labels": {"slo": "replag-lag"},
            }
            for w in windows
        ]

    # --- alerting -----------------------------------------------------------

    def alerting(self) -> list[dict[str, Any]]:
        p, w = self.p, self.p.rate_window
        a = self.alert
        sent = self.m("replag_probes_sent_total")
        lost = self.m("replag_probes_lost_total")
        rules = [
            a(
                "ReplagProbeLoss",
                f"pair:replag_probes_lost:ratio_rate{w} > {_num(p.probe_loss_ratio)}",
                for_=p.probe_loss_for,
                severity="warning",
                summary="{{ $labels.source }}→{{ $labels.target }}: "
                "{{ $value | humanizePercentage }} of probes lost",
                description=f"More than {_num(p.probe_loss_ratio * 100)} % of the probe writes "
                f"from {{{{ $labels.source }}}} were not seen in {{{{ $labels.target }}}} "
                f"within the probe timeout over {w} (built-in kind: probe_loss).",
            ),
            a(
                "ReplagLagHigh",
                f"pair:replag_lag_seconds:p99_rate{w} > {_num(p.lag_p99_limit_s)}",
                for_=p.lag_for,
                severity=p.lag_severity,
                summary="{{ $labels.source }}→{{ $labels.target }}: p99 lag "
                "{{ $value | humanizeDuration }}",
                description=f"p99 replication lag over {w} above {_num(p.lag_p99_limit_s)} s "
                "(built-in kind: lag_p99).",
            ),
            a(
                "ReplagReplicaNotReplicating",
                f"sum by ({REPLICA}) (rate({lost}[{p.not_replicating_window}]))\n/\n"
                f"sum by ({REPLICA}) (rate({sent}[{p.not_replicating_window}]))\n"
                f"> {_num(p.not_replicating_ratio)}",
                for_=p.not_replicating_for,
                severity="critical",
                summary="{{ $labels.target }}/{{ $labels.replica }} sees none of the probes "
                "from {{ $labels.source }}",
                description="The replica answers (or the probe would call it unreachable) but "
                "applies none of the probe writes: its replication link is cut or stalled, a "
                "partition (built-in: probe_loss at 100 %).",
            ),
            a(
                "ReplagReplicaUnreachable",
                f"max by (source) ({self.m('replag_unreachable_replicas')}) > 0",
                for_=p.unreachable_for,
                severity="critical",
                summary="{{ $labels.source }}: {{ $value }} replicas unreachable",
                description="The last probe rounds from {{ $labels.source }} could not "
                "connect to some replicas (built-in kind: unreachable).",
            ),
            a(
                "ReplagNoProbe",
                f"time() - max by (name) "
                f"({self.m('replag_last_success_timestamp_seconds', TASK_PROBE)})"
                f" > {_num(p.no_probe_s)}",
                severity="warning",
                summary="no successful probe from {{ $labels.name }} for "
                "{{ $value | humanizeDuration }}",
                description="replag exports a last successful probe for this source, and it "
                "is old (built-in kind: no_probe).",
            ),
            a(
                "ReplagReplicationLinkDown",
                f"min by ({REPLICATION}) ({self.m('replag_replication_link_up')}) == 0",
                for_=p.link_down_for,
                severity="critical",
                summary="{{ $labels.region }}/{{ $labels.replica }}: link to "
                "{{ $labels.primary }} down",
                description="The replica's link to its primary is down, it is resyncing, it "
                "replicates from elsewhere, or it cannot be read (built-in kind: "
                "replication_link_down).",
            ),
            a(
                "ReplagReplicationBytesBehind",
                f"replica:replag_replication_offset_lag_bytes:max > {_num(p.bytes_behind_limit)}",
                for_=p.bytes_behind_for,
                severity="warning",
                summary="{{ $labels.region }}/{{ $labels.replica }}: "
                "{{ $value | humanize1024 }}B behind {{ $labels.primary }}",
                description="Replication offset lag above the limit (built-in kind: "
                "replication_bytes_behind).",
            ),
            a(
                "ReplagBacklogAboutToWrap",
                f"replica:replag_replication_backlog_headroom_ratio:min < {_num(p.headroom_ratio)}",
                for_=p.headroom_for,
                severity="warning",
                summary="{{ $labels.region }}/{{ $labels.replica }}: backlog headroom "
                "{{ $value | humanizePercentage }}",
                description="The primary's writes are about to overwrite the part of its "
                "replication backlog this replica would resume from: a disconnect now means "
                "a full resync (built-in kind: replication_headroom).",
            ),
            a(
                "ReplagFullResync",
                f"sum by (source, primary) (increase("
                f"{self.m('replag_replication_resyncs_total', FULL)}"
                f"[{p.full_resync_over}])) > 0",
                severity="warning",
                summary="{{ $labels.primary }} served {{ $value | humanize }} full resyncs",
                description=f"The primary served full resyncs within {p.full_resync_over} "
                "(built-in kind: replication_full_resync).",
            ),
            a(
                "ReplagFailoverRPOBytes",
                f"primary:replag_replication_rpo_bytes:min > {_num(p.rpo_bytes_limit)}",
                for_=p.rpo_for,
                severity="warning",
                summary="a failover of {{ $labels.primary }} would lose "
                "{{ $value | humanize1024 }}B",
                description="Even the safest failover candidate is behind by more than the "
                "limit (built-in kind: failover_rpo_bytes).",
            ),
            a(
                "ReplagFailoverRPOTime",
                f"primary:replag_replication_rpo_seconds:min > {_num(p.rpo_seconds_limit)}",
                for_=p.rpo_for,
                severity="warning",
                summary="a failover of {{ $labels.primary }} would lose "
                "{{ $value | humanizeDuration }} of writes",
                description="Even the safest failover candidate is behind by more than the "
                "limit, in time (built-in kind: failover_rpo_time).",
            ),
            a(
                "ReplagDivergentKeys",
                "group:replag_divergent_keys:max > 0",
                severity="warning",
                summary="group {{ $labels.group }}: {{ $value }} divergent keys",
                description="The last check found keys that differ between the members of "
                "the group (built-in kind: divergent_keys).",
            ),
            a(
                "ReplagCheckFailing",
                f"group:replag_check_errors:increase{p.check_failing_over} > 0\n"
                f"unless on (group) group:replag_checks_ok:increase{p.check_failing_over} > 0",
                severity="warning",
                summary="group {{ $labels.group }}: every scheduled check failed for "
                f"{p.check_failing_over}",
                description="Scheduled repair checks of the group fail and none succeeded, "
                "so divergence goes unseen (built-in: divergent_keys with no data).",
            ),
            a(
                "ReplagDynomiteDroppedWrites",
                f"sum by (dc, rack, node) (\n"
                f"  increase({self.m('replag_dynomite_peer_dropped_requests_total')}"
                f"[{p.dynomite_dropped_over}])\n"
                f"  + increase({self.m('replag_dynomite_remote_peer_dropped_requests_total')}"
                f"[{p.dynomite_dropped_over}])\n) > 0",
                severity="critical",
                summary="Dynomite {{ $labels.node }} dropped {{ $value | humanize }} peer requests",
                description="Writes to a rack whose link was down were dropped, not queued: "
                "repair the affected groups (built-in kind: dynomite_dropped_writes).",
            ),
            a(
                "ReplagStoreDegraded",
                f"min by (instance) ({self.m('replag_store_writable')}) == 0",
                for_=p.store_degraded_for,
                severity="critical",
                summary="{{ $labels.instance }}: the results store takes no writes",
                description="replag keeps its writes in memory until the store takes them "
                "again; probing and alerting go on.",
            ),
            a(
                "ReplagStoreDroppingWrites",
                f"sum by (instance) (increase({self.m('replag_store_dropped_writes_total')}"
                f"[{p.store_degraded_for}])) > 0",
                severity="critical",
                summary="{{ $labels.instance }}: {{ $value | humanize }} deferred store writes "
                "dropped",
                description="The in-memory bound of deferred writes was reached: results "
                "are being lost.",
            ),
            a(
                "ReplagAlertDeliveryFailing",
                f"sum by (sink) (increase("
                f"{self.m('replag_alert_deliveries_total', FAILED)}"
                f"[{p.delivery_failing_over}])) > 0",
                severity="warning",
                summary="alert sink {{ $labels.sink }}: {{ $value | humanize }} failed deliveries",
                description="replag's own notifications to this sink fail.",
            ),
            a(
                "ReplagDown",
                f"up{{{p.selector}}} == 0",
                for_=p.absent_for,
                severity="warning",
                summary="{{ $labels.instance }}: replag cannot be scraped",
                description="Prometheus cannot scrape this replag instance.",
            ),
            a(
                "ReplagAbsent",
                f"absent(up{{{p.selector}}} == 1)",
                for_=p.absent_for,
                severity="critical",
                summary="no replag instance is up: nothing measures replication",
                description=f"No target of {{{p.selector}}} is up (or none is configured): "
                "every other replag alert is blind.",
            ),
        ]
        return [
            {"name": "replag.alerts", "rules": rules},
            {"name": "replag.slo.alerts", "rules": self.slo_alerting()},
        ]

    def slo_alerting(self) -> list[Rule]:
        budget = 1 - self.p.slo_objective
        out: list[Rule] = []
        for kind, severity in (("page", "critical"), ("ticket", "warning")):
            terms = [
                f"(\n  pair:replag_lag_slo_errors:ratio_rate{long} > {_num(rate)} * {_num(budget)}"
                f"\nand\n  pair:replag_lag_slo_errors:ratio_rate{short} > "
                f"{_num(rate)} * {_num(budget)}\n)"
                for long, short, rate, k in BURN_WINDOWS
                if k == kind
            ]
            name = "ReplagLagBudgetBurn" if kind == "page" else "ReplagLagBudgetSlowBurn"
            out.append(
                self.alert(
                    name,
                    "\nor\n".join(terms),
                    severity=severity,
                    summary="{{ $labels.source }}→{{ $labels.target }}: lag SLO error budget "
                    "burning",
                    description=f"More than {_num(budget * 100)} % of probes lost or seen "
                    f"later than {_num(self.p.slo_lag_s)} s, at a rate that spends the "
                    "30-day error budget "
                    + ("within days (page)" if kind == "page" else "within the month (ticket)")
                    + ".",
                )
            )
        return out


def _seconds(window: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(window[:-1]) * units[window[-1]]


def generate(params: MixinParams | None = None) -> dict[str, str]:
    """File name → its YAML text."""
    b = _Builder(params or MixinParams())
    header = "# generated by `python -m replag.prometheus_mixin`: edit the code, not this file\n"
    return {
        RECORDING_FILE: header + to_yaml({"groups": b.recording()}),
        ALERTING_FILE: header + to_yaml({"groups": b.alerting()}),
    }


# --- a small YAML writer (maps, lists, strings, numbers) -----------------------


def to_yaml(value: Any) -> str:
    return "\n".join(_yaml_lines(value, 0)) + "\n"


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _num(value)
    # Single quotes: PromQL's double quotes and backslashes stay as they are.
    return "'" + str(value).replace("'", "''") + "'"


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list):
                lines.append(f"{pad}{key}:")
                lines += _yaml_lines(item, indent + 2)
            elif isinstance(item, str) and "\n" in item:
                lines.append(f"{pad}{key}: |-")
                lines += [f"{pad}  {line}" for line in item.split("\n")]
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            inner = _yaml_lines(item, indent + 2)
            lines.append(f"{pad}- {inner[0].lstrip()}")
            lines += inner[1:]
    else:
        lines.append(f"{pad}{_scalar(value)}")
    return lines


def _parse_sets(values: tuple[str, ...]) -> MixinParams:
    fields = {f.name: f for f in dataclasses.fields(MixinParams)}
    changes: dict[str, Any] = {}
    for item in values:
        name, sep, raw = item.partition("=")
        if not sep or name not in fields:
            raise click.BadParameter(
                f"{item!r}: expected NAME=VALUE, NAME one of {', '.join(fields)}",
                param_hint="--set",
            )
        kind = type(getattr(MixinParams(), name))
        try:
            changes[name] = kind(raw)
        except ValueError:
            raise click.BadParameter(
                f"{name}: expected {kind.__name__}, got {raw!r}", param_hint="--set"
            ) from None
    try:
        return MixinParams(**changes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--set") from None


@click.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("deploy/prometheus"),
    show_default=True,
    help="Directory the rule files are written to.",
)
@click.option("--set", "sets", multiple=True, metavar="NAME=VALUE", help="Override a parameter.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if a file is stale.")
def main(out: Path, sets: tuple[str, ...], check: bool) -> None:
    """Write replag's Prometheus recording and alerting rules."""
    files = generate(_parse_sets(sets))
    stale = []
    for name, text in files.items():
        path = out / name
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(str(path))
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if check and stale:
        click.echo(f"stale: {', '.join(stale)} (run python -m replag.prometheus_mixin)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
