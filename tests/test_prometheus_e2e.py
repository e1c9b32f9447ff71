"""End to end: a real Prometheus (v0.316.0, REPLAG_PROMETHEUS, built once per machine by
.ci/go-tools.sh; skipped without it) scrapes a real `replag serve` over a lab, evaluates
the mixin's rule files (generated with short windows), and fires the partition alert
(`ReplagReplicaNotReplicating`) when a region is partitioned, then resolves it after
the heal. tests/test_helm_chart.py runs the same with what the Helm chart renders."""

from __future__ import annotations

from pathlib import Path

from replag.prometheus_mixin import generate
from tests.helpers.lab import LabFactory
from tests.helpers.partition_alert import FAST, partition_fires_and_resolves
from tests.helpers.prometheus_tools import binary, free_port


async def test_prometheus_fires_and_resolves_the_partition_alert(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    binary("REPLAG_PROMETHEUS", "prometheus")
    rule_files = []
    for name, text in generate(FAST).items():
        (tmp_path / name).write_text(text)
        rule_files.append(tmp_path / name)
    port = free_port()
    job = {"job_name": "replag", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
    fired = await partition_fires_and_resolves(
        lab_factory, tmp_path, port=port, rule_files=rule_files, scrape_job=job
    )
    assert fired["labels"]["replica"] == "eu-west-1"
    assert fired["labels"]["severity"] == "critical"
    assert fired["annotations"]["runbook_url"].endswith(
        "/runbooks/prometheus-alerts/#replagreplicanotreplicating"
    )
