"""OTLP export (replag.otlp, replag.tracing) into a real OpenTelemetry Collector (v0.161.0,
built once per machine by .ci/go-tools.sh; skipped without it): a `replag serve` over a
lab exports the lag as an exponential histogram, the registry's counters and gauges,
and the spans of its scheduled checks, with the semantic conventions' resource and
server attributes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers.lab import LabFactory
from tests.helpers.otelcol import Collector, collector
from tests.helpers.prometheus_tools import binary, free_port
from tests.helpers.serve_process import lab_config, start_serve
from tests.helpers.waiting import until

SETTINGS = {
    "count": 5,
    "rate": 0,
    "timeout": "1s",
    "probe_interval": "300ms",
    "check_interval": "2s",
    "otlp_interval": "500ms",
}


def attributes(item: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in item.get("attributes", [])}


def metrics(c: Collector) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(resource attributes, metric) of everything received."""
    return [
        (attributes(rm["resource"]), metric)
        for request in c.received("metrics")
        for rm in request["resourceMetrics"]
        for sm in rm["scopeMetrics"]
        for metric in sm["metrics"]
    ]


def spans(c: Collector) -> list[dict[str, Any]]:
    return [
        span
        for request in c.received("traces")
        for rs in request["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]


async def test_metrics_and_check_traces_arrive_in_a_collector(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    binary("REPLAG_OTELCOL", "otelcol-replag")
    lab = lab_factory(regions=("us-east", "eu-west"))
    with collector(tmp_path / "otelcol") as c:
        settings = {**SETTINGS, "store": str(tmp_path / "svc.sqlite"), "otlp_endpoint": c.endpoint}
        config = lab_config(Path(lab["dir"]), tmp_path / "replag.toml", **settings)
        log = tmp_path / "serve.log"
        serve = await start_serve(config, free_port(), log)
        try:

            def lag_seen() -> bool:
                assert serve.returncode is None, log.read_text()[-3000:]
                for _, metric in metrics(c):
                    for point in metric.get("exponentialHistogram", {}).get("dataPoints", []):
                        if attributes(point).get("replica") == "eu-west-1" and int(point["count"]):
                            return True
                return False

            def checked() -> bool:
                names = {s["name"] for s in spans(c)}
                return {"replag.check", "replag.check.group", "replag.scan.member"} <= names

            await until(lag_seen, "the lag histogram in the Collector", timeout_s=90)
            await until(checked, "a scheduled check's spans in the Collector", timeout_s=90)
        finally:
            serve.terminate()
            await serve.wait()

    received = metrics(c)
    resource = received[0][0]
    assert resource["service.name"] == "replag"
    assert resource["service.version"] and resource["service.instance.id"]
    by_name = {m["name"]: m for _, m in received}
    lag = by_name["replag.lag"]
    assert lag["unit"] == "s" and "exponentialHistogram" in lag
    sent = by_name["replag_probes_sent"]["sum"]
    assert sent["isMonotonic"] and any(float(p.get("asDouble", 0)) > 0 for p in sent["dataPoints"])
    assert "gauge" in by_name["replag_store_writable"]
    members = [s for s in spans(c) if s["name"] == "replag.scan.member"]
    server = attributes(members[0])
    assert server["db.system.name"] == "redis"
    assert server["server.address"] and int(server["server.port"]) > 0
    assert server["replag.replica"]
    # A check's member scans are inside its group's span, inside the check's.
    by_id = {s["spanId"]: s for s in spans(c)}

    def ancestors(span: dict[str, Any]) -> list[str]:
        names = []
        while span.get("parentSpanId") in by_id:
            span = by_id[span["parentSpanId"]]
            names.append(span["name"])
        return names

    chains = {tuple(ancestors(m)) for m in members}
    assert ("replag.scan_and_verify", "replag.check.group", "replag.check") in chains, chains
