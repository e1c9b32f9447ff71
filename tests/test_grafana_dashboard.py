"""The Grafana dashboard (grafana/replag-dashboard.json and the chart's copy): generated
by `replag.grafana_dashboard` from one definition and current, valid for Grafana's schema
as grafana-foundation-sdk types it, in rows by concern (Dynomite last and collapsed),
with the scope variables, a heatmap of the lag histogram and annotations of replag's own
events. That every expression reads an exported metric and every alert has a panel is
tests/test_prometheus_mixin.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from replag.grafana_dashboard import OUTPUTS, render
from tests.helpers.metric_names import exported_metrics, panels

ROOT = Path(__file__).resolve().parent.parent
BOARD: dict[str, Any] = json.loads((ROOT / OUTPUTS[0]).read_text())


def test_the_committed_dashboards_are_what_the_builder_writes() -> None:
    text = render()
    for path in OUTPUTS:
        assert (ROOT / path).read_text() == text, (
            f"{path} is stale: run python -m replag.grafana_dashboard"
        )


def test_the_dashboard_is_what_grafanas_schema_types_describe() -> None:
    """Read back through the SDK's model of a Grafana dashboard, nothing is lost or
    changed: every field is one the schema knows, of the type it says."""
    parsed = Dashboard.from_json(BOARD)
    assert json.loads(json.dumps(parsed, cls=JSONEncoder)) == BOARD
    for panel in panels(BOARD):
        assert panel["type"] in {"stat", "timeseries", "heatmap"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_rows_by_concern_with_dynomite_last_and_collapsed() -> None:
    rows = [p for p in BOARD["panels"] if p["type"] == "row"]
    assert [r["title"] for r in rows] == [
        "Overview", "Lag", "Replication", "Repair", "Agents", "replag itself", "Dynomite",
    ]  # fmt: skip
    assert rows[-1]["collapsed"] is True and rows[-1]["panels"]
    assert all(not r["collapsed"] for r in rows[:-1])
    assert all(p["type"] == "row" or "dynomite" not in p["title"].lower() for p in BOARD["panels"])
    # Panels sit below their row, none overlapping another.
    ys = [p["gridPos"]["y"] for p in BOARD["panels"]]
    assert ys == sorted(ys)


def test_variables_scope_every_query() -> None:
    names = [v["name"] for v in BOARD["templating"]["list"]]
    assert names[:5] == ["datasource", "cluster", "namespace", "job", "instance"]
    for panel in panels(BOARD):
        for target in panel["targets"]:
            for selector in re.findall(r"replag_[a-z_]+\{([^}]*)\}", target["expr"]):
                for scope in ("cluster", "namespace", "job", "instance"):
                    assert f'{scope}=~"${scope}"' in selector, (panel["title"], selector)


def test_a_heatmap_of_the_lag_histogram() -> None:
    [heatmap] = [p for p in panels(BOARD) if p["type"] == "heatmap"]
    [target] = heatmap["targets"]
    assert "replag_lag_seconds_bucket" in target["expr"] and target["format"] == "heatmap"
    assert heatmap["options"]["calculate"] is False  # the buckets are Prometheus'


def test_annotations_mark_resyncs_failovers_and_repair_runs() -> None:
    annotations = {a["name"]: a["expr"] for a in BOARD["annotations"]["list"]}
    exported = exported_metrics()
    wanted = {
        "Full resyncs": "replag_replication_resyncs_total",
        "Failovers followed": "replag_replication_failovers_total",
        "Repair runs": "replag_repair_runs_total",
    }
    for name, metric in wanted.items():
        assert metric in annotations[name] and metric in exported
