"""replag's Grafana dashboard, as code: one definition, built with grafana-foundation-sdk.

`python -m replag.grafana_dashboard` writes `grafana/replag-dashboard.json` and the Helm
chart's copy (`deploy/helm/replag/files/`, for the Grafana sidecar's ConfigMap);
`--check` writes nothing and exits 1 naming each stale file. The SDK is a development
dependency (the `dev` extra), never imported by the service.

Rows by concern, top to bottom: overview, lag, replication, repair, agents, the service
itself, Dynomite (last, collapsed). Variables: datasource, cluster, namespace, job,
instance, then source, target, replica. Annotations mark replag's own events: full
resyncs, followed failovers and repair runs (increases of their counters).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.builders.common import (
    ScaleDistributionConfig,
    VizLegendOptions,
    VizTooltipOptions,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import heatmap as heatmap_model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUTPUTS = (
    Path("grafana/replag-dashboard.json"),
    Path("deploy/helm/replag/files/replag-dashboard.json"),
)
UID = "replag-overview"
DS = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Every series of replag carries these (the scrape's labels); `cluster` and `namespace`
# where the Prometheus adds them (an empty label matches ".*").
SCOPE = 'cluster=~"$cluster", namespace=~"$namespace", job=~"$job", instance=~"$instance"'
PAIRS = 'source=~"$source", target=~"$target", replica=~"$replica"'
REPLICA_BY = "source, target, replica, rack"
# Label matchers (kept out of f-strings: Python 3.11 allows no backslash or quote reuse there).
PROBE = 'task="probe"'
DYNOMITE_STATS = 'task="dynomite_stats"'
FULL = 'kind="full"'
REPAIR = 'action="repair"'
ONE_SECOND = 'le=~"1|1\\\\.0"'


def m(name: str, *extra: str) -> str:
    """A selector of one of replag's series within the dashboard's scope."""
    return f"{name}{{{', '.join((SCOPE, *extra))}}}"


@dataclass
class Panel:
    """One panel: its kind, title, queries (PromQL, legend) and unit."""

    kind: str  # timeseries | stat | heatmap
    title: str
    queries: list[tuple[str, str]]
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8


@dataclass
class Row:
    title: str
    panels: list[Panel] = field(default_factory=list)
    collapsed: bool = False


def rate(name: str, *extra: str) -> str:
    return f"rate({m(name, *extra)}[$__rate_interval])"


def inc(name: str, window: str, *extra: str) -> str:
    return f"increase({m(name, *extra)}[{window}])"


def peer_requests(outcome: str) -> str:
    """Dynomite peer requests dropped or timed out, local and remote peers, per node."""
    local = inc(f"replag_dynomite_peer_{outcome}_requests_total", "5m")
    remote = inc(f"replag_dynomite_remote_peer_{outcome}_requests_total", "5m")
    return f"sum by (dc, rack, node) ({local} + {remote})"


def lag_quantile(q: float, by: str) -> str:
    buckets = rate("replag_lag_seconds_bucket", PAIRS)
    return f"histogram_quantile({q}, sum by (le, {by}) ({buckets}))"


def ratio(by: str) -> str:
    lost = rate("replag_probes_lost_total", PAIRS)
    sent = rate("replag_probes_sent_total", PAIRS)
    return f"sum by ({by}) ({lost}) / sum by ({by}) ({sent})"


def rows() -> list[Row]:
    """The dashboard's one definition."""
    slo = (
        f"clamp_min(1 - sum by (source, target) "
        f"({rate('replag_lag_seconds_bucket', PAIRS, ONE_SECOND)}) / "
        f"sum by (source, target) (rate({m('replag_probes_sent_total', PAIRS)}"
        f"[$__rate_interval])), 0)"
    )
    return [
        Row(
            "Overview",
            [
                Panel(
                    "stat",
                    "Alerts firing",
                    [(f"sum({m('replag_alerts_firing')})", "")],
                    width=6,
                    height=4,
                ),
                Panel(
                    "stat",
                    "Unreachable replicas",
                    [(f"sum({m('replag_unreachable_replicas')})", "")],
                    width=6,
                    height=4,
                ),
                Panel(
                    "stat",
                    "Divergent keys (all groups)",
                    [(f"sum({m('replag_divergent_keys')})", "")],
                    width=6,
                    height=4,
                ),
                Panel(
                    "stat",
                    "Since last successful probe",
                    [(f"time() - max({m('replag_last_success_timestamp_seconds', PROBE)})", "")],
                    unit="s",
                    width=6,
                    height=4,
                ),
            ],
        ),
        Row(
            "Lag",
            [
                Panel(
                    "timeseries",
                    "p99 replication lag per replica",
                    [(lag_quantile(0.99, REPLICA_BY), "{{source}} → {{replica}}")],
                    unit="s",
                ),
                Panel(
                    "timeseries",
                    "p50 replication lag per replica",
                    [(lag_quantile(0.5, REPLICA_BY), "{{source}} → {{replica}}")],
                    unit="s",
                ),
                Panel(
                    "heatmap",
                    "Lag distribution (every replica in scope)",
                    [
                        (
                            f"sum by (le) ({rate('replag_lag_seconds_bucket', PAIRS)})",
                            "{{le}}",
                        )
                    ],
                    unit="s",
                    description="Probes per second in each bucket of replag_lag_seconds.",
                ),
                Panel(
                    "timeseries",
                    "Probe loss ratio per replica",
                    [(ratio(REPLICA_BY), "{{source}} → {{replica}}")],
                    unit="percentunit",
                ),
                Panel(
                    "timeseries",
                    "p99 replication lag per region (every replica merged)",
                    [(lag_quantile(0.99, "source, target"), "{{source}} → {{target}}")],
                    unit="s",
                ),
                Panel(
                    "timeseries",
                    "Probe loss ratio per region (every replica summed)",
                    [(ratio("source, target"), "{{source}} → {{target}}")],
                    unit="percentunit",
                ),
                Panel(
                    "timeseries",
                    "Lag SLO: probes later than 1 s or lost (error ratio per region pair)",
                    [(slo, "{{source}} → {{target}}")],
                    unit="percentunit",
                ),
                Panel(
                    "timeseries",
                    "Probe write latency (p50 / p99)",
                    [
                        (
                            f"histogram_quantile({q}, sum by (le, source) "
                            f"({rate('replag_write_latency_seconds_bucket')}))",
                            f"p{int(q * 100)} {{{{source}}}}",
                        )
                        for q in (0.5, 0.99)
                    ],
                    unit="s",
                ),
            ],
        ),
        Row(
            "Replication",
            [
                Panel(
                    "timeseries",
                    "Replication: bytes behind per replica",
                    [(m("replag_replication_offset_lag_bytes"), "{{primary}} → {{replica}}")],
                    unit="bytes",
                ),
                Panel(
                    "timeseries",
                    "Replication: backlog headroom",
                    [(m("replag_replication_backlog_headroom_ratio"), "{{replica}}")],
                    unit="percentunit",
                ),
                Panel(
                    "timeseries",
                    "Replication: links down and resyncs",
                    [
                        (
                            f"sum by (source) (1 - {m('replag_replication_link_up')})",
                            "down {{source}}",
                        ),
                        (
                            "sum by (source, kind) ("
                            + inc("replag_replication_resyncs_total", "5m")
                            + ")",
                            "{{kind}} resyncs {{source}}",
                        ),
                    ],
                ),
                Panel(
                    "timeseries",
                    "Failover RPO (what a failover to each replica would lose now)",
                    [
                        (m("replag_replication_rpo_bytes"), "bytes {{replica}}"),
                        (m("replag_replication_rpo_seconds"), "seconds {{replica}}"),
                    ],
                ),
                Panel(
                    "timeseries",
                    "Primary write rate and sample read skew",
                    [
                        (m("replag_replication_write_rate_bytes_per_second"), "write {{primary}}"),
                        (m("replag_replication_read_skew_seconds"), "skew {{primary}}"),
                    ],
                    width=24,
                ),
            ],
        ),
        Row(
            "Repair",
            [
                Panel(
                    "timeseries",
                    "Divergent keys per replica group",
                    [(m("replag_divergent_keys"), "{{group}}")],
                ),
                Panel(
                    "timeseries",
                    "Repair runs and keys (per hour)",
                    [
                        (
                            "sum by (group, action, outcome) ("
                            + inc("replag_repair_runs_total", "1h")
                            + ")",
                            "{{action}} {{outcome}} {{group}}",
                        ),
                        (
                            f"sum by (group, outcome) ({inc('replag_repair_keys_total', '1h')})",
                            "keys {{outcome}} {{group}}",
                        ),
                    ],
                ),
            ],
        ),
        Row(
            "Agents",
            [
                Panel(
                    "timeseries",
                    "Agent trees: keys and pending re-reads",
                    [
                        (m("replag_agent_tree_keys"), "keys {{replica}}"),
                        (m("replag_agent_pending_keys"), "pending {{replica}}"),
                    ],
                    description="From each agent's own /metrics (scrape the agents to fill it).",
                ),
                Panel(
                    "timeseries",
                    "Agent bytes sent (what crosses the WAN) and memory",
                    [
                        (
                            f"sum by (instance) ({rate('replag_agent_response_bytes_total')})",
                            "sent {{instance}}",
                        ),
                        (m("replag_agent_resident_bytes"), "resident {{instance}}"),
                    ],
                    unit="bytes",
                ),
            ],
        ),
        Row(
            "replag itself",
            [
                Panel(
                    "timeseries",
                    "Probe runs and unreachable replicas",
                    [
                        (
                            f"sum by (source, outcome) ({rate('replag_probe_runs_total')})",
                            "{{outcome}} {{source}}",
                        ),
                        (m("replag_unreachable_replicas"), "unreachable {{source}}"),
                    ],
                ),
                Panel(
                    "timeseries",
                    "Time since last success",
                    [
                        (
                            f"time() - {m('replag_last_success_timestamp_seconds')}",
                            "{{task}} {{name}}",
                        )
                    ],
                    unit="s",
                ),
                Panel(
                    "timeseries",
                    "Results store: writable, deferred and dropped writes",
                    [
                        (m("replag_store_writable"), "writable {{instance}}"),
                        (m("replag_store_deferred_writes"), "deferred {{instance}}"),
                        (
                            f"{inc('replag_store_dropped_writes_total', '5m')}",
                            "dropped {{instance}}",
                        ),
                    ],
                ),
                Panel(
                    "timeseries",
                    "Alert deliveries (per hour)",
                    [
                        (
                            "sum by (sink, outcome) ("
                            + inc("replag_alert_deliveries_total", "1h")
                            + ")",
                            "{{sink}} {{outcome}}",
                        )
                    ],
                ),
                Panel(
                    "timeseries",
                    "replag instances up (scraped by Prometheus)",
                    [(f"up{{{SCOPE}}}", "{{instance}}")],
                ),
                Panel(
                    "timeseries",
                    "Alerts of the Prometheus mixin (firing)",
                    [
                        (
                            "sum by (alertname, severity) "
                            '(ALERTS{alertname=~"Replag.*", alertstate="firing"})',
                            "{{alertname}}",
                        )
                    ],
                ),
            ],
        ),
        Row(
            "Dynomite",
            [
                Panel(
                    "timeseries",
                    "Dynomite dropped / timed-out peer requests (per 5m)",
                    [
                        (
                            peer_requests("dropped"),
                            "dropped {{node}}",
                        ),
                        (
                            peer_requests("timedout"),
                            "timed out {{node}}",
                        ),
                    ],
                ),
                Panel(
                    "timeseries",
                    "Dynomite cross-zone / cross-region p99",
                    [
                        (m(f"replag_dynomite_{n}"), f"{n} {{{{node}}}}")
                        for n in (
                            "cross_zone_latency_p99_seconds",
                            "cross_region_rtt_p99_seconds",
                            "cross_zone_queue_wait_p99_seconds",
                            "cross_region_queue_wait_p99_seconds",
                        )
                    ],
                    unit="s",
                ),
                Panel(
                    "timeseries",
                    "Dynomite peer queues",
                    [
                        (m(f"replag_dynomite_{n}"), f"{n} {{{{node}}}}")
                        for n in (
                            "peer_out_queue",
                            "remote_peer_out_queue",
                            "peer_in_queue",
                            "remote_peer_in_queue",
                        )
                    ],
                ),
                Panel(
                    "timeseries",
                    "Dynomite /info reads",
                    [
                        (
                            "time() - "
                            + m("replag_last_success_timestamp_seconds", DYNOMITE_STATS),
                            "since read {{name}}",
                        ),
                        (
                            f"sum by (node) ({inc('replag_dynomite_stats_errors_total', '5m')})",
                            "errors {{node}}",
                        ),
                    ],
                ),
            ],
            collapsed=True,
        ),
    ]


# Annotations: replag's own events, where a counter of them increased.
ANNOTATIONS = (
    (
        "Full resyncs",
        "red",
        f"sum by (source, primary) ({inc('replag_replication_resyncs_total', '2m', FULL)}) > 0",
    ),
    (
        "Failovers followed",
        "orange",
        f"sum by (source) ({inc('replag_replication_failovers_total', '2m')}) > 0",
    ),
    (
        "Repair runs",
        "blue",
        f"sum by (group, outcome) ({inc('replag_repair_runs_total', '2m', REPAIR)}) > 0",
    ),
)


def _variable(name: str, label: str, metric: str, scope: str = "") -> gd.QueryVariable:
    selector = f"{{{scope}}}" if scope else ""
    return (
        gd.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query(f"label_values({metric}{selector}, {name})")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(True)
        .all_value(".*")
        .current(model.VariableOption(selected=True, text="All", value="$__all"))
    )


def variables() -> list[gd.QueryVariable | gd.DatasourceVariable]:
    runs = "replag_probe_runs_total"
    sent = "replag_probes_sent_total"
    return [
        gd.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        _variable("cluster", "Cluster", runs),
        _variable("namespace", "Namespace", runs, 'cluster=~"$cluster"'),
        _variable("job", "Job", runs, 'cluster=~"$cluster", namespace=~"$namespace"'),
        _variable(
            "instance",
            "Instance",
            runs,
            'cluster=~"$cluster", namespace=~"$namespace", job=~"$job"',
        ),
        _variable("source", "Source", sent, SCOPE),
        _variable("target", "Target", sent, f'{SCOPE}, source=~"$source"'),
        _variable("replica", "Replica", sent, f'{SCOPE}, source=~"$source", target=~"$target"'),
    ]


def _panel(p: Panel) -> Any:
    targets = [
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend or "__auto")
        .ref_id(chr(ord("A") + i))
        .datasource(DS)
        for i, (expr, legend) in enumerate(p.queries)
    ]
    if p.kind == "stat":
        panel: Any = stat.Panel()
    elif p.kind == "heatmap":
        for t in targets:
            t.format(PromQueryFormat.HEATMAP)
        panel = (
            heatmap.Panel()
            .calculate(False)
            .y_axis(heatmap.YAxisConfig().unit(p.unit))
            .color(
                heatmap.HeatmapColorOptions()
                .mode(heatmap_model.HeatmapColorMode.SCHEME)
                .scheme("Oranges")
            )
            .cell_gap(1)
        )
    else:
        panel = (
            timeseries.Panel()
            .fill_opacity(8)
            .line_width(1)
            .unit(p.unit)
            .legend(
                VizLegendOptions()
                .display_mode(common.LegendDisplayMode.LIST)
                .placement(common.LegendPlacement.BOTTOM)
                .show_legend(True)
                .calcs([])
            )
            .tooltip(
                VizTooltipOptions()
                .mode(common.TooltipDisplayMode.MULTI)
                .sort(common.SortOrder.DESCENDING)
            )
        )
        if p.unit == "s":
            panel.scale_distribution(
                ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10)
            )
    panel.title(p.title).datasource(DS).targets(targets).span(p.width).height(p.height)
    if p.kind == "stat":
        panel.unit(p.unit)
    if p.description:
        panel.description(p.description)
    return panel


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    board = (
        gd.Dashboard("replag: replication lag and divergence")
        .uid(UID)
        .tags(["replag", "redis", "replication"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("30s")
        .variables(variables())  # type: ignore[arg-type]
        .annotations(
            [
                gd.AnnotationQuery()
                .name(name)
                .datasource(DS)
                .enable(True)
                .icon_color(colour)
                .expr(expr)
                for name, colour, expr in ANNOTATIONS
            ]
        )
    )
    for row in rows():
        grafana_row = gd.Row(row.title).collapsed(row.collapsed)
        if row.collapsed:
            for p in row.panels:
                grafana_row.with_panel(_panel(p))
            board.with_row(grafana_row)
        else:
            board.with_row(grafana_row)
            for p in row.panels:
                board.with_panel(_panel(p))
    data: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return data


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


@click.command()
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if a file is stale.")
def main(check: bool) -> None:
    """Write replag's Grafana dashboard (grafana/ and the Helm chart's copy)."""
    text = render()
    stale = [p for p in OUTPUTS if not p.exists() or p.read_text() != text]
    if check:
        if stale:
            names = ", ".join(map(str, stale))
            click.echo(f"stale: {names} (run python -m replag.grafana_dashboard)", err=True)
            sys.exit(1)
        return
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


if __name__ == "__main__":
    main()
