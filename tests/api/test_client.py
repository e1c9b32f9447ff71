"""A client generated from a live `replag serve`'s /openapi.json by a standard generator
(openapi-python-client) calls every operation and parses every answer; alert webhooks
link to `public_url`, not to the address the service binds."""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from replag.lab.server import free_port
from tests.helpers.cli import replag_argv, replag_env
from tests.helpers.redis_servers import primary_and_replicas
from tests.helpers.waiting import wait_until

pytest.importorskip("openapi_python_client")
TOKEN = "client-test-token"
PUBLIC_URL = "https://replag.example.net/ops"


class _Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self.received.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:  # keep pytest's output clean
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A real webhook receiver: its URL, and the notifications it received."""
    received: list[dict[str, Any]] = []
    handler = type("Hook", (_Hook,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()
    server.server_close()


def _generate(openapi: dict[str, Any], where: Path) -> Any:
    """The client package, generated into `where` and imported."""
    where.mkdir(parents=True, exist_ok=True)
    spec = where / "openapi.json"
    spec.write_text(json.dumps(openapi))
    subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(spec),
         "--meta", "none", "--output-path", str(where / "replag_client")],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    sys.path.insert(0, str(where))
    return importlib.import_module("replag_client")


def test_a_generated_client_works_against_a_live_serve(
    tmp_path: Path, hook: tuple[str, list[dict[str, Any]]]
) -> None:
    hook_url, received = hook
    with primary_and_replicas(tmp_path / "redis") as (primary, *replicas):
        dead = f"redis://127.0.0.1:{free_port()}"
        config = tmp_path / "replag.toml"
        config.write_text(tomli_w.dumps({
            "settings": {"store": str(tmp_path / "s.sqlite"), "api_token": TOKEN,
                         "public_url": PUBLIC_URL + "/", "count": 10, "rate": 0,
                         "timeout": "1s", "probe_interval": "500ms"},
            "regions": [{"name": "a", "write": primary.url,
                         "replicas": [*(r.url for r in replicas), dead]}],
            "groups": [{"name": "main", "members": [r.url for r in replicas]}],
            "alerts": {"rules": [{"name": "down", "kind": "unreachable"}],
                       "sinks": [{"name": "hook", "kind": "webhook", "url": hook_url}]},
        }))  # fmt: skip
        port = free_port()
        proc = subprocess.Popen(
            replag_argv("serve", "-c", str(config), "--port", str(port)),
            stderr=subprocess.PIPE, text=True, env=replag_env(),
        )  # fmt: skip
        try:
            _use_the_generated_client(f"http://127.0.0.1:{port}", tmp_path, proc)
            wait_until(lambda: bool(received), "the unreachable alert's webhook", timeout_s=60)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    notification = received[0]
    assert notification["externalURL"] == PUBLIC_URL
    assert notification["alerts"][0]["generatorURL"] == PUBLIC_URL + "/#alerts"


def _use_the_generated_client(base: str, tmp_path: Path, proc: subprocess.Popen[str]) -> None:
    def answering() -> bool:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            health = httpx.get(base + "/api/v1/health").json()
        except httpx.TransportError:
            return False
        return bool(health["pairs"])  # a probe round is in the store

    wait_until(answering, "serve answering with a probe round", timeout_s=60)
    openapi = httpx.get(base + "/openapi.json").json()
    pkg = _generate(openapi, tmp_path / "generated")
    api = importlib.import_module("replag_client.api.default")
    client = pkg.AuthenticatedClient(base_url=base, token=TOKEN, raise_on_unexpected_status=True)

    def call(name: str, **kwargs: Any) -> Any:
        module = importlib.import_module(f"{api.__name__}.{name}")
        answer = module.sync_detailed(client=client, **kwargs)
        assert 200 <= answer.status_code < 300, (name, answer.content)
        assert answer.parsed is not None and type(answer.parsed).__name__ != "ErrorBody", name
        return answer.parsed

    health = call("health_api_v1_health_get")
    assert health.status == "failing" and health.pairs  # the dead replica
    topology = call("topology_api_v1_topology_get")
    assert [r.name for r in topology.regions] == ["a"]
    lag = call("lag_api_v1_lag_get", since="1h")
    assert lag.pairs and lag.pairs[0].lag_ms.p50 is not None
    matrix = call("lag_matrix_api_v1_lag_matrix_get", since="1h")
    assert matrix.regions == ["a"] and matrix.cells[0].colour
    series = call("lag_series_api_v1_lag_series_get", source="a", target="a", since="1h")
    assert series.points
    replication = call("replication_api_v1_replication_get")
    (state,) = replication.primaries
    replica = state.replicas[0].replica
    call("replication_series_api_v1_replication_series_get", source="a", replica=replica)
    call("dynomite_api_v1_dynomite_get")
    call("alerts_api_v1_alerts_get")
    models = importlib.import_module("replag_client.models")
    body = models.RepairRequest(action=models.RepairRequestAction.CHECK)
    job = call("start_repair_api_v1_repairs_post", body=body)
    assert job.action == "check"

    def finished() -> bool:
        run = call("repair_run_api_v1_repairs_run_id_get", run_id=job.job_id)
        return bool(run.job.state != "running")

    wait_until(finished, "the check", timeout_s=60)
    listed = call("repairs_api_v1_repairs_get")
    assert listed.total >= 1 and listed.runs[0].kind == "check"
    run = call("repair_run_api_v1_repairs_run_id_get", run_id=listed.runs[0].run_id)
    assert run.run_id == listed.runs[0].run_id
