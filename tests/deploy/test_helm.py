"""deploy/helm/replag: `helm lint`, `helm template`, and the rendered serve container run
with docker exactly as rendered until its readiness endpoint answers.

helm is built once per machine from the Go module proxy (`.ci/container-tests`);
tests/helpers/helm.py finds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from tests.deploy.docker import (
    PREFIX,
    ROOT,
    docker,
    logs,
    run,
    service_image,
    wait_postgres,
)
from tests.deploy.kube import Manifest, Rendered, docker_run_args, probe_port
from tests.helpers.helm import helm_binary

pytestmark = pytest.mark.container

CHART = ROOT / "deploy" / "helm" / "replag"
TOKEN = "helm-test-token-0123456789"
PASSWORD = "helm-test-store-password"
VALUES = {
    "image": {"repository": "replag", "tag": "test", "pullPolicy": "Never"},
    "store": {"url": "postgresql://replag@postgresql:5432/replag", "password": PASSWORD},
    "apiToken": TOKEN,
    "agents": [{"region": "eu-west"}],
    "serviceMonitor": {"enabled": True},
    "config": """\
[settings]
probe_interval = "2s"
timeout = "500ms"

[[regions]]
name = "us-east"
write = "redis://redis-primary:6379"
replicas = [{ name = "us-east-1", url = "redis://redis-primary:6379" }]

[[regions]]
name = "eu-west"
replicas = [{ name = "eu-west-1", url = "redis://redis-replica:6379" }]
agent = "http://rel-replag-agent-eu-west:8701"

[[groups]]
name = "main"
members = ["us-east-1", "eu-west-1"]
""",
}


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_binary()


@pytest.fixture(scope="module")
def values(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("helm") / "values.yaml"
    path.write_text(yaml.safe_dump(VALUES))
    return path


@pytest.fixture(scope="module")
def rendered(helm: str, values: Path) -> Rendered:
    out = run([helm, "template", "rel", str(CHART), "-f", str(values)], timeout=120)
    return Rendered([d for d in yaml.safe_load_all(out) if d])


def test_helm_lint_passes_with_the_defaults_and_the_tests_values(helm: str, values: Path) -> None:
    run([helm, "lint", "--strict", str(CHART)], timeout=120)
    run([helm, "lint", "--strict", str(CHART), "-f", str(values)], timeout=120)


def test_the_chart_renders_what_a_production_deployment_needs(rendered: Rendered) -> None:
    serve = rendered.find("Deployment", "-serve")
    assert serve["spec"]["replicas"] == 2
    pod = serve["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    assert container["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    env = {e["name"]: e for e in container["env"]}
    secret = rendered.find("Secret")["metadata"]["name"]
    assert env["REPLAG_STORE"]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": "store-url"}
    assert env["REPLAG_API_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "api-token"
    assert rendered.data("Secret", secret)["store-password"] == PASSWORD
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/etc/replag/config", "/etc/replag/secrets"} <= mounts
    assert "[[regions]]" in rendered.find("ConfigMap")["data"]["replag.toml"]
    assert rendered.find("PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert rendered.find("ServiceMonitor")["spec"]["endpoints"][0]["path"] == "/metrics"
    assert len(rendered.all("NetworkPolicy")) == 2  # serve's, and the agents'
    agent = rendered.find("Deployment", "-agent-eu-west")
    assert "eu-west" in agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert rendered.find("Service", "-agent-eu-west")["spec"]["ports"][0]["port"] == 8701


def run_rendered(
    rendered: Rendered, component: str, workdir: Path, network: str, alias: str
) -> tuple[str, str, Manifest]:
    """Run the rendered Deployment ending in `component` as a container named PREFIX +
    component on `network` (reachable there as `alias`, its Service's name); wait until
    its readiness probe answers 200. Returns the container, its published base URL and
    the pod's container spec."""
    deployment = rendered.find("Deployment", component)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    workdir.mkdir()
    spec = docker_run_args(rendered, deployment, workdir)
    path, port = probe_port(container, "readinessProbe", spec.ports)
    name = PREFIX + component.strip("-")
    docker("run", "-d", "--name", name, "--network", network, "--network-alias", alias,
           "--publish", f"127.0.0.1::{port}", *spec.args)  # fmt: skip
    host_port = docker("port", name, f"{port}/tcp").splitlines()[0].rsplit(":", 1)[1]
    base = f"http://127.0.0.1:{host_port}"
    until(f"{name}: {path} answering 200", name, lambda: httpx.get(base + path, timeout=5))
    return name, base, container


def until(what: str, name: str, get: Callable[[], httpx.Response], timeout_s: float = 120) -> None:
    """Until `get()` answers 200, while container `name` runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = docker("inspect", "-f", "{{.State.Status}}", name)
        assert state == "running", f"{name} is {state}:\n{logs(name)}"
        try:
            if get().status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"never within {timeout_s:g} s: {what}\n{logs(name)}"
        time.sleep(1)


def test_the_rendered_containers_become_ready_in_docker(
    rendered: Rendered, image: str, tmp_path: Path
) -> None:
    """serve beside the PostgreSQL its Secret names; the eu-west agent beside the Redis
    replica the ConfigMap names; both run exactly as rendered until ready."""
    redis = service_image("redis")
    network, store = PREFIX + "helm", PREFIX + "helm-postgres"
    servers = {"redis-primary": [], "redis-replica": ["--replicaof", "redis-primary", "6379"]}
    started = [store, *(PREFIX + alias for alias in servers)]
    docker("network", "create", network)
    try:
        docker("run", "-d", "--name", store, "--network", network,
               "--network-alias", "postgresql", "--env", "POSTGRES_USER=replag",
               "--env", "POSTGRES_DB=replag", "--env", f"POSTGRES_PASSWORD={PASSWORD}",
               service_image("postgres"))  # fmt: skip
        for alias, extra in servers.items():
            docker("run", "-d", "--name", PREFIX + alias, "--network", network,
                   "--network-alias", alias, redis, "redis-server", "--protected-mode", "no",
                   "--notify-keyspace-events", "KA", *extra)  # fmt: skip
        wait_postgres(store)
        assert (
            rendered.find("Deployment", "-serve")["spec"]["template"]["spec"]["containers"][0][
                "image"
            ]
            == image
        )
        agent_service = rendered.find("Service", "-agent-eu-west")["metadata"]["name"]
        agent, _, _ = run_rendered(
            rendered, "-agent-eu-west", tmp_path / "agent", network, agent_service
        )
        started.append(agent)
        serve, base, container = run_rendered(
            rendered, "-serve", tmp_path / "serve", network, "serve"
        )
        started.append(serve)
        live_path = container["livenessProbe"]["httpGet"]["path"]
        assert httpx.get(base + live_path, timeout=5).json() == {"status": "ok"}
        # The store is the PostgreSQL the Secret names, with the password from its file.
        tables = docker("exec", store, "psql", "-U", "replag", "-d", "replag", "-Atc",
                        "select count(*) from information_schema.tables "
                        "where table_schema = 'public'")  # fmt: skip
        assert int(tables) > 0, logs(serve)

        def measured() -> httpx.Response:  # probes written in us-east, seen on eu-west
            response = httpx.get(base + "/api/v1/lag?since=5m", timeout=10)
            pairs = response.json()["pairs"]
            seen = any(p["target"] == "eu-west" and p["seen"] for p in pairs)
            return response if seen else httpx.Response(404)

        until("a probe seen on eu-west", serve, measured)
    finally:
        docker("rm", "-f", *started, check=False)
        docker("network", "rm", network, check=False)
