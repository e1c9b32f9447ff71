"""Health counts loss and staleness; the matrix colours each pair by the rules covering it."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from replag.alerts.health import record_probe
from replag.api.app import create_app
from replag.config import Config, config_from_dict
from replag.replication import history
from replag.replication.state import PrimaryState, ReplicaState, ReplicationSnapshot
from replag.store import LagWindow, Store
from tests.helpers.lag_windows import add_windows

S = 10**9


def make_config(tmp_path: Path, rules: list[dict[str, Any]] | None = None) -> Config:
    return config_from_dict({
        "settings": {"store": str(tmp_path / "s.sqlite"), "probe_interval": "10s",
                     "timeout": "5s", "max_loss": 0.05},
        "regions": [
            {"name": "us-east", "write": "redis://127.0.0.1:1", "replicas": []},
            {"name": "us-west", "replicas": ["redis://127.0.0.1:2"]},
            {"name": "eu-west", "replicas": ["redis://127.0.0.1:3"]},
        ],
        "alerts": {"rules": rules or []},
    }, where="replag.toml", environ={})  # fmt: skip


def run(store: Store, target: str, *, end_ns: int, sent: int, seen: int, lag_ms: float) -> None:
    """The windows one probe run leaves for one replica."""
    w = LagWindow(
        run_id=f"r{end_ns}", source="us-east", target=target, replica=f"{target}-1",
        start_ns=end_ns - S, end_ns=end_ns, sent=sent, seen=seen, lost=sent - seen,
    )  # fmt: skip
    for _ in range(seen):
        w.lag.record_us(lag_ms * 1000)
    store.append_windows([w])


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Store, Config, httpx.AsyncClient]]:
    config = make_config(tmp_path)
    store = Store(tmp_path / "s.sqlite")
    app: FastAPI = create_app(config, store=store, run_schedulers=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replag") as client:
            yield store, config, client


async def health(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/api/v1/health")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


async def test_a_replica_reachable_but_not_replicating_is_failing(
    served: tuple[Store, Config, httpx.AsyncClient],
) -> None:
    store, _, client = served
    now = time.time_ns()
    assert (await health(client))["status"] == "ok"  # nothing probed yet: nothing wrong known
    record_probe(store, source="us-east", run_id="r1", unreachable=[], error=None)
    run(store, "eu-west", end_ns=now - 10 * S, sent=20, seen=20, lag_ms=80)
    run(store, "us-west", end_ns=now - 10 * S, sent=20, seen=20, lag_ms=40)
    body = await health(client)
    assert body["status"] == "ok" and body["problems"] == []
    assert {p["target"]: p["state"] for p in body["pairs"]} == {"eu-west": "ok", "us-west": "ok"}
    # eu-west is partitioned: the replica answers, but none of the latest run's probes arrive.
    run(store, "eu-west", end_ns=now, sent=20, seen=0, lag_ms=0)
    run(store, "us-west", end_ns=now, sent=20, seen=19, lag_ms=40)
    body = await health(client)
    assert body["status"] == "failing"
    problems = {p["kind"]: p for p in body["problems"]}
    assert set(problems) == {"not_replicating"}  # 1/20 lost is within max_loss (5 %)
    assert problems["not_replicating"]["target"] == "eu-west"
    assert (
        "none of 20 probes seen in the latest run (reachable, not replicating)"
        in (problems["not_replicating"]["message"])
    )
    assert "last probe seen at " in problems["not_replicating"]["message"]
    states = {p["target"]: p for p in body["pairs"]}
    assert states["eu-west"]["state"] == "not_replicating"
    assert states["eu-west"]["last_seen_ns"] == now - 10 * S
    assert states["us-west"]["state"] == "lossy"
    # Healed, but us-west now loses more than max_loss: degraded, not failing.
    run(store, "eu-west", end_ns=now + S, sent=20, seen=20, lag_ms=80)
    run(store, "us-west", end_ns=now + S, sent=20, seen=15, lag_ms=40)
    body = await health(client)
    assert body["status"] == "degraded"
    assert [p["kind"] for p in body["problems"]] == ["loss"]


async def test_failed_and_stale_sources_and_unreachable_replicas_fail_health(
    served: tuple[Store, Config, httpx.AsyncClient],
) -> None:
    store, _, client = served
    now = time.time_ns()
    down = [{"replica": "eu-west-1", "region": "eu-west", "error": "Connection refused"}]
    record_probe(store, source="us-east", run_id="r1", unreachable=down, error=None, at_ns=now)
    body = await health(client)
    assert body["status"] == "failing"
    [problem] = body["problems"]
    assert problem["kind"] == "unreachable" and problem["replica"] == "eu-west-1"
    # Its probes were not seen either (a dead node): said once, as unreachable, never also
    # as "reachable, not replicating".
    run(store, "eu-west", end_ns=now, sent=20, seen=0, lag_ms=0)
    body = await health(client)
    assert [(p["kind"], p["replica"]) for p in body["problems"]] == [("unreachable", "eu-west-1")]
    run(store, "eu-west", end_ns=now + S, sent=20, seen=20, lag_ms=80)  # back
    # 3 intervals + the timeout (35 s) without a successful probe: stale.
    record_probe(store, source="us-east", run_id="r2", unreachable=[], error=None,
                 at_ns=now - 40 * S)  # fmt: skip
    body = await health(client)
    assert [p["kind"] for p in body["problems"]] == ["stale"]
    # Its age is counted when health answers: 40 s, or more on a slow machine.
    age = re.search(r"no successful probe from us-east for (\d+) s", body["problems"][0]["message"])
    assert age is not None and int(age[1]) >= 40, body["problems"][0]["message"]
    write_down = [{"replica": "us-east-primary", "region": "us-east", "error": "refused"}]
    record_probe(store, source="us-east", run_id=None, unreachable=write_down, error="refused")
    body = await health(client)
    assert [p["kind"] for p in body["problems"]] == ["probe_error", "stale"]


async def test_matrix_colours_follow_each_pairs_rules_and_loss(tmp_path: Path) -> None:
    rules = [
        {"name": "eu", "kind": "lag_p99", "threshold": "50ms", "target": "eu-west"},
        {"name": "any", "kind": "lag_p99", "threshold": "300ms", "severity": "critical"},
        {"name": "loss", "kind": "probe_loss", "threshold": 0.01},
    ]
    store = Store(tmp_path / "s.sqlite")
    add_windows(store, pairs=[("us-east", "eu-west", 80.0), ("us-east", "us-west", 80.0)],
                minutes=5)  # fmt: skip
    add_windows(store, pairs=[("us-west", "eu-west", 5.0)], minutes=5, lost=10)
    now = time.time_ns()
    run(store, "us-east", end_ns=now, sent=20, seen=0, lag_ms=0)  # a pair that saw nothing
    app = create_app(make_config(tmp_path, rules), store=store, run_schedulers=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replag") as client:
            body = (await client.get("/api/v1/lag/matrix", params={"since": "10m"})).json()
    cells = {(c["source"], c["target"]): c for c in body["cells"]}
    # The 50 ms rule covers eu-west only: us-west at the same 80 ms stays green.
    assert cells[("us-east", "eu-west")]["colour"] == "warning"
    assert cells[("us-east", "eu-west")]["lag_ms"] == {"warning": 50.0, "critical": 300.0}
    assert cells[("us-east", "us-west")]["colour"] == "ok"
    assert cells[("us-east", "us-west")]["lag_ms"] == {"warning": 300.0, "critical": 300.0}
    # Low lag, but 10 of 60 probes lost: loss colours it.
    assert cells[("us-west", "eu-west")]["colour"] == "warning"
    assert cells[("us-east", "us-east")]["colour"] == "critical"
    assert cells[("us-east", "us-east")]["p99_ms"] is None
    assert body["thresholds_ms"] == {"warning": 300.0, "critical": 300.0}


async def test_headroom_colours_follow_the_headroom_rules_covering_each_replica(
    tmp_path: Path,
) -> None:
    rules = [
        {"name": "west", "kind": "replication_headroom", "threshold": 0.9, "target": "us-west"},
        {"name": "all", "kind": "replication_headroom", "threshold": 0.3, "severity": "critical"},
    ]
    store = Store(tmp_path / "s.sqlite")
    replicas = tuple(
        ReplicaState(replica=f"{region}-1", region=region, address="", status="ok",
                     bytes_behind=0, bytes_uncertainty=0, backlog_headroom=int(16384 * left),
                     headroom_fraction=left)
        for region, left in (("us-west", 0.8), ("eu-west", 0.8), ("us-east", 0.2))
    )  # fmt: skip
    primary = PrimaryState(source="us-east", primary="us-east-primary", address="",
                           sampled_ns=time.time_ns(), offset=5000, backlog_size=16384,
                           sync_full=0, replicas=replicas)  # fmt: skip
    history.record_snapshot(store, ReplicationSnapshot(primaries=[primary]))
    app = create_app(make_config(tmp_path, rules), store=store, run_schedulers=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replag") as client:
            status = (await client.get("/api/v1/replication")).json()
            matrix = (await client.get("/api/v1/lag/matrix", params={"since": "10m"})).json()
    rows = {r["replica"]: r for r in status["primaries"][0]["replicas"]}
    # 80 % left: under us-west's 90 % rule (amber; red under the 30 % rule), fine elsewhere.
    assert rows["us-west-1"]["headroom_colour"] == "warning"
    assert rows["us-west-1"]["headroom_bands"] == {"warning": 0.9, "critical": 0.3}
    assert rows["eu-west-1"]["headroom_colour"] == "ok"
    assert rows["eu-west-1"]["headroom_bands"] == {"warning": 0.3, "critical": 0.3}
    assert rows["us-east-1"]["headroom_colour"] == "critical"
    cells = {c["target"]: c["headroom_colour"] for c in matrix["replication"]}
    assert cells == {"us-west": "warning", "eu-west": "ok", "us-east": "critical"}
