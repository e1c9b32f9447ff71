"""deploy/helm/replag without Docker: `helm lint --strict`, the values schema refusing
what it does not know, the objects for the Prometheus Operator and Grafana agreeing on
the job, and the chart rendered with a release other than `replag` into a real
Prometheus (rules from the rendered PrometheusRule's spec, the job as the Operator would
name it from the rendered ServiceMonitor): a partition fires and resolves
`ReplagReplicaNotReplicating`. helm and prometheus are built once per machine
(tests/helpers/helm.py, .ci/go-tools.sh); their tests skip without them.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from replag.prometheus_mixin import CHART_RULES_FILE, CHART_SELECTOR, chart_rules
from tests.helpers.helm import CHART, ROOT, helm, render
from tests.helpers.lab import LabFactory
from tests.helpers.operator_scrape import service_monitor_job
from tests.helpers.partition_alert import FAST, partition_fires_and_resolves
from tests.helpers.prometheus_tools import binary, free_port

Doc = dict[str, Any]
EVERYTHING = {
    "serviceMonitor": {"enabled": True},
    "podMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Redis"}},
    "ingress": {"enabled": True, "className": "nginx"},
    "agents": [{"region": "eu-west"}],
    "extraVolumes": [{"name": "redis-ca", "secret": {"secretName": "redis-ca"}}],
    "extraVolumeMounts": [{"name": "redis-ca", "mountPath": "/etc/replag/tls/ca"}],
    "serve": {"extraEnv": [{"name": "REDIS_PASSWORD", "value": "x"}]},
}


def find(docs: list[Doc], kind: str, suffix: str = "") -> Doc:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"].endswith(suffix):
            return doc
    raise AssertionError(f"no {kind} *{suffix} rendered")


def rule_exprs(rule: Doc) -> list[str]:
    return [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]


def test_the_chart_rules_are_what_the_mixin_writes() -> None:
    assert (CHART / CHART_RULES_FILE).read_text() == chart_rules(), (
        f"{CHART_RULES_FILE} is stale: run python -m replag.prometheus_mixin"
    )


def test_the_chart_dashboard_is_the_generated_one() -> None:
    chart_copy = CHART / "files" / "replag-dashboard.json"
    assert chart_copy.read_text() == (ROOT / "grafana" / "replag-dashboard.json").read_text()


def test_helm_lint_strict_passes_with_defaults_and_every_option(tmp_path: Path) -> None:
    helm("lint", "--strict", str(CHART))
    values = tmp_path / "everything.yaml"
    values.write_text(yaml.safe_dump(EVERYTHING))
    helm("lint", "--strict", str(CHART), "-f", str(values))


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("serve.replicas=two", r"serve.*replicas.*(integer|got string)"),
        ("serviceMonitor.enable=true", r"serviceMonitor.*(additional|enable)"),
        ("metrics.job=a'b", r"metrics.*job"),
    ],
)
def test_the_schema_refuses_a_mistyped_or_unknown_value(setting: str, complaint: str) -> None:
    for command in (["template", "rel"], ["lint", "--strict"]):
        result = helm(*command, str(CHART), "--set", setting, check=False)
        assert result.returncode != 0, (setting, result.stdout)
        assert re.search(complaint, result.stderr + result.stdout, re.S), result.stderr


def test_monitors_and_rules_agree_on_the_job_whatever_the_release(tmp_path: Path) -> None:
    docs = render("rel", EVERYTHING, tmp_path)
    service = find(docs, "Service", "rel-replag")
    monitor, pods = find(docs, "ServiceMonitor"), find(docs, "PodMonitor")
    serve_pod = find(docs, "Deployment", "-serve")["spec"]["template"]["metadata"]["labels"]
    for jobbed, labels in ((monitor, service["metadata"]["labels"]), (pods, serve_pod)):
        assert labels[jobbed["spec"]["jobLabel"]] == "replag"
    agents = find(docs, "ServiceMonitor", "-agents")["spec"]
    agent_service = find(docs, "Service", "-agent-eu-west")["metadata"]["labels"]
    assert agent_service[agents["jobLabel"]] == "replag"
    secret = find(docs, "Secret")["metadata"]["name"]
    auth = agents["endpoints"][0]["authorization"]["credentials"]
    assert auth == {"name": secret, "key": "api-token"}
    exprs = rule_exprs(find(docs, "PrometheusRule"))
    assert all("__REPLAG_JOB__" not in e for e in exprs)
    reading = [e for e in exprs if re.search(r"(replag_[a-z_]+|up)\{", e)]
    assert reading and all('job="replag"' in e for e in reading)

    renamed = render("rel", {**EVERYTHING, "metrics": {"job": "redis-lag"}}, tmp_path)
    assert find(renamed, "Service", "rel-replag")["metadata"]["labels"]["replag.io/job"] == (
        "redis-lag"
    )
    assert all(
        'job="redis-lag"' in e for e in rule_exprs(find(renamed, "PrometheusRule")) if "{" in e
    )
    chosen = {**EVERYTHING, "prometheusRule": {"enabled": True, "selector": 'job="x", ns="y"'}}
    assert 'up{job="x", ns="y"} == 0' in rule_exprs(
        find(render("rel", chosen, tmp_path), "PrometheusRule")
    )


def test_dashboard_volumes_account_and_ingress(tmp_path: Path) -> None:
    docs = render("rel", EVERYTHING, tmp_path)
    dashboard = find(docs, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "Redis"}
    generated = json.loads((ROOT / "grafana" / "replag-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["replag.json"]) == generated
    account = find(docs, "ServiceAccount")["metadata"]["name"]
    for suffix in ("-serve", "-agent-eu-west"):
        pod = find(docs, "Deployment", suffix)["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == account
        assert pod["automountServiceAccountToken"] is False
        assert {"name": "redis-ca", "secret": {"secretName": "redis-ca"}} in pod["volumes"]
        mounts = pod["containers"][0]["volumeMounts"]
        assert {"name": "redis-ca", "mountPath": "/etc/replag/tls/ca"} in mounts
    serve = find(docs, "Deployment", "-serve")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "REDIS_PASSWORD", "value": "x"} in serve["env"]
    ingress = find(docs, "Ingress")["spec"]
    assert ingress["ingressClassName"] == "nginx"
    backend = ingress["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": find(docs, "Service", "rel-replag")["metadata"]["name"],
                       "port": {"name": "http"}}  # fmt: skip
    plain = render("rel", {}, tmp_path)
    assert {d["kind"] for d in plain}.isdisjoint(
        {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Ingress"}
    )


async def test_a_release_not_called_replag_fires_and_resolves_the_partition_alert(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    """The chart's template and the mixin's rules, with the test's short windows written
    into a copy of the chart (the defaults would need minutes of partition)."""
    binary("REPLAG_PROMETHEUS", "prometheus")
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / CHART_RULES_FILE).write_text(chart_rules(FAST))
    docs = render(
        "rel",
        {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
        tmp_path,
        chart=chart,
    )
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(find(docs, "PrometheusRule")["spec"]))
    assert CHART_SELECTOR not in rules.read_text()
    port = free_port()
    service = find(docs, "Service", "rel-replag")
    job = service_monitor_job(
        find(docs, "ServiceMonitor"), service, address=f"127.0.0.1:{port}", interval="1s"
    )
    fired = await partition_fires_and_resolves(
        lab_factory, tmp_path, port=port, rule_files=[rules], scrape_job=job
    )
    labels = fired["labels"]
    assert labels["replica"] == "eu-west-1" and labels["severity"] == "critical"
    # The job the rules select, though the Service (and the Operator's default) says rel-replag.
    assert service["metadata"]["name"] == "rel-replag"
