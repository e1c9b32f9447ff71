"""Replication state in the service: samples on its own schedule, alert rules, /metrics and
the API, on a real lab whose small backlog a partition outruns."""

from __future__ import annotations

import asyncio
import math
import time
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from replag.api.app import create_app
from replag.config import config_from_dict
from replag.errors import ConfigError
from replag.lab.cluster import lab_fault
from replag.replication import history
from replag.replication.state import PrimaryState, ReplicaState, ReplicationSnapshot
from replag.service import ReplagService
from replag.store import Store
from tests.helpers.lab import LabFactory
from tests.helpers.waiting import until

RULES = [
    {"name": "behind", "kind": "replication_bytes_behind", "threshold": 1000},
    {"name": "headroom", "kind": "replication_headroom", "threshold": 0.5},
    {"name": "link", "kind": "replication_link_down", "threshold": "0s"},
    {"name": "full-resync", "kind": "replication_full_resync", "over": "10m"},
    {"name": "rpo", "kind": "failover_rpo_bytes", "threshold": 1000},
]


def service(lab: dict[str, Any], tmp_path: Path) -> ReplagService:
    data = tomllib.loads((Path(lab["dir"]) / "topology.toml").read_text())
    data["settings"].update(store=str(tmp_path / "svc.sqlite"), replication_interval="200ms")
    data["alerts"] = {"rules": RULES}
    config = config_from_dict(data, where="test", environ={})
    return ReplagService(config, store=Store(tmp_path / "svc.sqlite"))


def states(svc: ReplagService) -> dict[tuple[str, str], str]:
    """(rule, replica or primary) → alert status, for alerts not resolved."""
    return {
        (a["rule"], a["labels"].get("replica") or a["labels"].get("primary")): a["status"]
        for a in svc.alert_book.active()
    }


def replica_series(metric: str, replica: str, region: str) -> str:
    return f'{metric}{{primary="a-primary",region="{region}",replica="{replica}",source="a"}} '


def write(port: int, count: int, prefix: str) -> None:
    with redis.Redis(port=port) as client:
        pipe = client.pipeline(transaction=False)
        for i in range(count):
            pipe.set(f"{prefix}{i}", b"x" * 100)
        pipe.execute()


@pytest.fixture
async def svc(lab_factory: LabFactory, tmp_path: Path) -> AsyncIterator[ReplagService]:
    lab = lab_factory(regions=("a", "b"), delays_ms={"b": 1}, backlog_bytes=16384)
    svc = service(lab, tmp_path)
    svc.lab = lab  # type: ignore[attr-defined]
    yield svc
    await svc.stop()


async def b1(svc: ReplagService) -> Any:
    """b-1's state and its primary's, from a sample taken once a-1 (in the primary's own
    region, no delay) has every write: a sample taken while the last writes are in flight
    to it (a busy host) would fire a-1's alerts too."""
    deadline = time.monotonic() + 30  # bounds a hang only
    while True:
        await svc.replication_round()
        (primary,) = svc.latest_replication()
        a1 = next(r for r in primary.replicas if r.replica == "a-1")
        if a1.bytes_behind == 0 or time.monotonic() > deadline:
            return next(r for r in primary.replicas if r.replica == "b-1"), primary


async def test_headroom_rule_fires_before_the_full_resync_then_the_resync_rule(
    svc: ReplagService,
) -> None:
    lab = svc.lab  # type: ignore[attr-defined]
    lab_dir = Path(lab["dir"])
    primary_port = next(p["port"] for p in lab["processes"] if p["role"] == "primary")
    # Every configured replica has its series before anything was read.
    before_any = svc.metrics.render().decode()
    for region in ("a", "b"):
        replica = f"{region}-1"
        assert replica_series("replag_replication_link_up", replica, region) + "0.0" in before_any
        for unknown in (
            "offset_lag_bytes",
            "offset_lag_uncertainty_bytes",
            "backlog_headroom_bytes",
            "backlog_headroom_ratio",
            "rpo_bytes",
            "rpo_seconds",
        ):
            series = replica_series(f"replag_replication_{unknown}", replica, region)
            assert series + "NaN" in before_any
    for kind in ("full", "partial_ok", "partial_err"):
        labels = f'kind="{kind}",primary="a-primary",source="a"'
        assert f"replag_replication_resyncs_total{{{labels}}} 0.0" in before_any

    state, first = await b1(svc)
    assert state.status == "ok" and states(svc) == {}
    resyncs = first.sync_full

    lab_fault(lab_dir, "b", "partition")
    write(primary_port, 20, "p")
    state, _ = await b1(svc)
    assert state.status == "link-down"
    assert states(svc) == {("behind", "b-1"): "firing", ("link", "b-1"): "firing"}

    # Writes go on: headroom falls under half the backlog while the reconnect would
    # still be partial; the rule fires now, before any full resync.
    batch = 0
    while state.headroom_fraction is not None and state.headroom_fraction >= 0.5:
        write(primary_port, 10, f"h{batch}-")
        batch += 1
        state, primary = await b1(svc)
    assert state.backlog_headroom is not None and state.backlog_headroom > 0
    assert states(svc)[("headroom", "b-1")] == "firing"
    assert primary.sync_full == resyncs
    assert ("full-resync", "a-primary") not in states(svc)

    while state.backlog_headroom is not None and state.backlog_headroom >= 0:
        write(primary_port, 30, f"g{batch}-")
        batch += 1
        state, primary = await b1(svc)
    lab_fault(lab_dir, "b", "heal")
    deadline = time.monotonic() + 120  # bounds a hang only
    while not (state.status == "ok" and state.bytes_behind == 0):
        assert time.monotonic() < deadline, f"b-1 never caught up after the heal: {state}"
        state, primary = await b1(svc)
    assert primary.sync_full == (resyncs or 0) + 1
    assert states(svc) == {("full-resync", "a-primary"): "firing"}
    text = svc.metrics.render().decode()
    full = 'replag_replication_resyncs_total{kind="full",primary="a-primary",source="a"} '
    assert f"{full}{primary.sync_full}.0" in text
    assert replica_series("replag_replication_link_up", "b-1", "b") + "1.0" in text
    assert replica_series("replag_replication_rpo_bytes", "a-1", "a") + "0.0" in text
    assert len(history.replica_series(svc.store, source="a", replica="b-1", since_ns=0)) >= 4


async def test_api_shows_state_rpo_and_series(svc: ReplagService) -> None:
    lab = svc.lab  # type: ignore[attr-defined]
    lab_fault(Path(lab["dir"]), "b", "partition")
    primary_port = next(p["port"] for p in lab["processes"] if p["role"] == "primary")
    write(primary_port, 20, "k")
    await svc.replication_round()
    await svc.replication_round()
    app = create_app(svc.config, run_schedulers=False, service=svc)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://replag") as client:
        status = (await client.get("/api/v1/replication")).json()
        (primary,) = status["primaries"]
        replicas = {r["replica"]: r for r in primary["replicas"]}
        assert replicas["b-1"]["status"] == "link-down" and replicas["b-1"]["bytes_behind"] > 2000
        assert primary["failover"]["safest"] == "a-1" and primary["failover"]["safe"] is True
        assert [c["replica"] for c in primary["failover"]["candidates"]] == ["a-1", "b-1"]
        series = (
            await client.get("/api/v1/replication/series?source=a&replica=b-1&since=5m")
        ).json()
        assert sum(p["samples"] for p in series["points"]) == 2
        assert all(p["link_up_ratio"] == 0 for p in series["points"])
        # The lab's replicas are read-only, and each stored sample says so.
        assert all(p["read_only"] is True for p in series["points"])
        assert max(p["bytes_behind_max"] for p in series["points"]) > 2000
        unknown = await client.get("/api/v1/replication/series?source=a&replica=nope")
        assert unknown.status_code == 404 and "a/b-1" in unknown.text
        matrix = (await client.get("/api/v1/lag/matrix")).json()
        cell = next(c for c in matrix["replication"] if c["target"] == "b")
        assert cell["links_down"] == 1 and cell["bytes_behind"] > 2000
        assert not math.isnan(cell["headroom_fraction"])


async def test_service_schedules_its_own_samples_and_prunes_them(
    svc: ReplagService,
) -> None:
    await svc.start()
    await until(lambda: svc.counters["replication samples"] >= 2, "two replication rounds")
    assert history.latest_primaries(svc.store)
    deleted = history.prune(svc.store, time.time_ns())
    assert deleted["replication_replicas"] >= 4


def test_old_samples_thin_to_the_worst_per_window(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    minute = 60 * 10**9
    try:
        for i, behind in enumerate([10, 500, 20, 30, 40, 7]):  # two per minute, 3 minutes
            replica = ReplicaState(
                replica="r", region="b", address="", status="ok", bytes_behind=behind
            )
            snapshot = ReplicationSnapshot(
                primaries=[
                    PrimaryState(
                        source="a",
                        primary="p",
                        address="",
                        sampled_ns=i * minute // 2,
                        sync_full=i,
                        replicas=(replica,),
                    )
                ]
            )
            history.record_snapshot(store, snapshot)
        # Only whole minutes before the cut are thinned; the third stays at full resolution.
        assert history.thin(store, older_than_ns=2 * minute + 1, window_ns=minute) == 4
        kept = history.replica_series(store, source="a", replica="r", since_ns=0)
        assert [state.bytes_behind for _, state in kept] == [500, 30, 40, 7]
        assert history.thin(store, older_than_ns=2 * minute + 1, window_ns=minute) == 0
    finally:
        store.close()


@pytest.mark.parametrize(
    ("rule", "threshold", "message"),
    [
        ({"kind": "replication_bytes_behind", "threshold": "lots"}, None, "a size like 1mb"),
        ({"kind": "replication_headroom", "threshold": 1.5}, None, "between 0 and 1"),
        ({"kind": "failover_rpo_time", "threshold": "fast"}, None, "duration"),
        ({"kind": "replication_bytes_behind", "threshold": "8mb"}, 8 * 2**20, None),
        ({"kind": "failover_rpo_bytes"}, 2**20, None),
        ({"kind": "failover_rpo_time", "threshold": "250ms"}, 0.25, None),
        ({"kind": "replication_link_down", "threshold": "30s"}, 30.0, None),
    ],
)
def test_replication_rule_thresholds(
    rule: dict[str, Any], threshold: float | None, message: str | None
) -> None:
    data = {
        "regions": [{"name": "a", "write": "redis://127.0.0.1:6379", "replicas": []}],
        "alerts": {"rules": [{"name": "r", **rule}]},
    }
    if message is None:
        (parsed,) = config_from_dict(data, where="t.toml", environ={}).alerts.rules
        assert parsed.threshold == threshold
        return
    with pytest.raises(ConfigError) as raised:
        config_from_dict(data, where="t.toml", environ={})
    assert "alerts.rules[0].threshold" in str(raised.value) and message in str(raised.value)


async def test_matrix_after_an_idle_interval_shows_the_partition(svc: ReplagService) -> None:
    """The matrix's replication cells are cached between requests; the first request after
    a quiet spell must not answer the cells built before a partition as the present."""
    await svc.start()
    app = create_app(svc.config, run_schedulers=False, service=svc)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://replag") as client:

        async def b_cell() -> dict[str, Any]:
            matrix = (await client.get("/api/v1/lag/matrix")).json()
            return next(c for c in matrix["replication"] if c["target"] == "b")

        await until(lambda: svc.counters["replication samples"] >= 1, "a replication round")
        assert (await b_cell())["links_down"] == 0
        asked = time.monotonic()
        lab_fault(Path(svc.lab["dir"]), "b", "partition")  # type: ignore[attr-defined]

        def sampled_down() -> bool:
            (primary,) = svc.latest_replication()
            return any(r.replica == "b-1" and not r.link_up for r in primary.replicas)

        await until(sampled_down, "a sample showing b-1's link down")
        interval = svc.settings.replication_interval
        idle = 2 * interval - (time.monotonic() - asked)  # no matrix request meanwhile
        await asyncio.sleep(max(idle, 0.0))
        assert (await b_cell())["links_down"] == 1
