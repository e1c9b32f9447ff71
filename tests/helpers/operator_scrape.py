"""The scrape job the Prometheus Operator makes of a ServiceMonitor, without Kubernetes.

The Operator turns a ServiceMonitor into a `kubernetes_sd_configs` job named
`serviceMonitor/NAMESPACE/NAME/INDEX` whose relabelling keeps the endpoints of Services
the selector matches on the endpoint's port, and sets `namespace`, `service`, `pod`,
`container`, then `job` (the Service's name, or, when the monitor has a `jobLabel`, the
value of that label of the Service) and `endpoint`, then the endpoint's own
`relabelings` (prometheus-operator's pkg/prometheus/promcfg.go). Here the target is a
static one carrying the `__meta_kubernetes_*` labels Kubernetes discovery would give the
rendered Service's endpoint, so the same relabelling runs in a real Prometheus.
"""

from __future__ import annotations

import re
from typing import Any

Manifest = dict[str, Any]


def sanitize(name: str) -> str:
    """A Kubernetes label name as Prometheus' discovery writes it into a meta label."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def service_monitor_job(
    monitor: Manifest,
    service: Manifest,
    *,
    address: str,
    namespace: str = "default",
    pod: str = "replag-serve-0",
    container: str = "serve",
    interval: str | None = None,
) -> Manifest:
    """The scrape config of `monitor`'s first endpoint, its target `address` standing for
    the pod behind `service`'s port."""
    spec = monitor["spec"]
    endpoint = spec["endpoints"][0]
    service_name = service["metadata"]["name"]
    meta = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_service_name": service_name,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_container_name": container,
        "__meta_kubernetes_endpoint_port_name": service["spec"]["ports"][0]["name"],
    }
    for key, value in service["metadata"].get("labels", {}).items():
        meta[f"__meta_kubernetes_service_label_{sanitize(key)}"] = str(value)
        meta[f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"] = "true"
    relabel: list[Manifest] = [
        {
            "source_labels": [f"__meta_kubernetes_service_label_{sanitize(k)}"],
            "regex": f"({re.escape(str(v))})",
            "action": "keep",
        }
        for k, v in spec["selector"].get("matchLabels", {}).items()
    ]
    relabel.append(
        {
            "source_labels": ["__meta_kubernetes_endpoint_port_name"],
            "regex": endpoint["port"],
            "action": "keep",
        }
    )
    for source, target in (
        ("namespace", "namespace"),
        ("service_name", "service"),
        ("pod_name", "pod"),
        ("pod_container_name", "container"),
    ):
        relabel.append({"source_labels": [f"__meta_kubernetes_{source}"], "target_label": target})
    relabel.append(
        {
            "source_labels": ["__meta_kubernetes_service_name"],
            "target_label": "job",
            "replacement": "${1}",
        }
    )
    if spec.get("jobLabel"):
        relabel.append(
            {
                "source_labels": [f"__meta_kubernetes_service_label_{sanitize(spec['jobLabel'])}"],
                "target_label": "job",
                "regex": "(.+)",
                "replacement": "${1}",
            }
        )
    relabel.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    relabel += [_snake(r) for r in endpoint.get("relabelings", [])]
    job: Manifest = {
        "job_name": f"serviceMonitor/{namespace}/{monitor['metadata']['name']}/0",
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": interval or endpoint.get("interval", "30s"),
        "static_configs": [{"targets": [address], "labels": meta}],
        "relabel_configs": relabel,
    }
    if endpoint.get("metricRelabelings"):
        job["metric_relabel_configs"] = [_snake(r) for r in endpoint["metricRelabelings"]]
    return job


def _snake(relabeling: Manifest) -> Manifest:
    """A ServiceMonitor RelabelConfig (sourceLabels, targetLabel) in Prometheus' spelling."""
    return {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): v for k, v in relabeling.items()}
