"""A real 3-rack Dynomite DC under `serve`: each rack is its own replica everywhere.

rack3's dynomite is stopped (its backend keeps running, as in a rack outage): the
writes through rack1's node never reach it. The DC's one region pair must not
average that away: rack3 alone is not_replicating, red, and its own series in
`/metrics` and `/api/v1/lag` show every probe lost while rack1 and rack2 lose none.
The healthy nodes' dropped-writes alert names the peer that is down.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from replag.api.app import create_app
from replag.config import Config
from tests.helpers.dynomite_cluster import DynomiteCluster, DynomiteFactory
from tests.helpers.waiting import until

RACKS = ("dc1-rack1", "dc1-rack2", "dc1-rack3")
RULE = (
    '\n[[alerts.rules]]\nname = "dynomite-drops"\nkind = "dynomite_dropped_writes"\nover = "5s"\n'
)


async def serve_config(cluster: DynomiteCluster, tmp_path: Path) -> Config:
    return await cluster.discovered_config(
        tmp_path / "dyn.toml",
        extra=RULE,
        REPLAG_STORE=str(tmp_path / "s.sqlite"),
        REPLAG_PROBE_INTERVAL="200ms",
        REPLAG_CHECK_INTERVAL="1h",
        REPLAG_COUNT="20",
        REPLAG_RATE="0",
        REPLAG_TIMEOUT="1s",
    )


@asynccontextmanager
async def served(config: Config) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(config)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        yield await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replag")
        )


def per_replica(metrics: str, family: str) -> dict[str, float]:
    """replica → value of one counter family's series of dc1→dc1."""
    out = {}
    for metric in text_string_to_metric_families(metrics):
        for s in metric.samples:
            if s.name == family and s.labels.get("target") == "dc1":
                out[s.labels["replica"]] = s.value
    return out


async def test_a_stopped_rack_is_its_own_replica_in_health_api_metrics_and_matrix(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    cluster = dynomite_factory()
    config = await serve_config(cluster, tmp_path)
    async with served(config) as client:

        async def get(path: str, **params: Any) -> Any:
            response = await client.get(path, params=params)
            assert response.status_code == 200, response.text
            return response.json() if path.startswith("/api") else response.text

        # Every rack's series exists before the first probe result, at 0.
        first = await get("/metrics")
        assert set(per_replica(first, "replag_probes_lost_total")) == set(RACKS)
        assert 'rack="rack3",replica="dc1-rack3",source="dc1",target="dc1"' in first

        async def replicas_now() -> dict[str, str]:
            pairs = (await get("/api/v1/health"))["pairs"]  # none before the first run
            return {r["replica"]: r["state"] for p in pairs for r in p["replicas"]}

        async def all_ok() -> bool:
            return await replicas_now() == dict.fromkeys(RACKS, "ok")

        await until(all_ok, "every rack replicating")
        cluster.node("node3").stop()

        async def rack3_silent() -> bool:
            return (await replicas_now()).get("dc1-rack3") == "not_replicating"

        await until(rack3_silent, "rack3 not replicating")
        health = await get("/api/v1/health")
        assert health["status"] == "failing"
        (pair,) = health["pairs"]
        assert pair["state"] == "not_replicating"
        states = {r["replica"]: r["state"] for r in pair["replicas"]}
        assert states["dc1-rack1"] == states["dc1-rack2"] == "ok"
        [problem] = [p for p in health["problems"] if p["kind"] == "not_replicating"]
        assert problem["replica"] == "dc1-rack3" and problem["severity"] == "critical"
        # Every run from the one that found rack3 silent on: rack3 lost all, the others none.
        since = str((pair["run_end_ns"] - 1000) / 1e9)
        before = await get("/metrics")

        async def another_run() -> bool:
            (now,) = (await get("/api/v1/health"))["pairs"]
            return bool(now["run_end_ns"] > pair["run_end_ns"])

        await until(another_run, "another probe run")
        (lag,) = (await get("/api/v1/lag", since=since))["pairs"]
        figures = {r["replica"]: r for r in lag["replicas"]}
        assert figures["dc1-rack3"]["loss_ratio"] == 1.0 and figures["dc1-rack3"]["sent"] > 0
        for rack in ("dc1-rack1", "dc1-rack2"):
            assert figures[rack]["loss_ratio"] == 0.0 and figures[rack]["seen"] > 0
        after = await get("/metrics")
        sent = _grown(before, after, "replag_probes_sent_total")
        lost = _grown(before, after, "replag_probes_lost_total")
        assert sent["dc1-rack3"] > 0 and lost["dc1-rack3"] == sent["dc1-rack3"]
        for rack in ("dc1-rack1", "dc1-rack2"):
            assert sent[rack] > 0 and lost[rack] == 0
        matrix = await get("/api/v1/lag/matrix", since=since)
        (cell,) = matrix["cells"]
        assert cell["colour"] == "critical"
        colours = {r["replica"]: r["colour"] for r in cell["replicas"]}
        assert colours["dc1-rack3"] == "critical"
        assert colours["dc1-rack1"] == colours["dc1-rack2"] == "ok"

        # rack1's node keeps failing to reach rack3's: its alert names that peer.
        node3 = cluster.node("node3").stats_url

        async def naming_the_peer() -> bool:
            active = (await get("/api/v1/alerts"))["active"]
            return any(
                a["rule"] == "dynomite-drops" and a["labels"].get("rack") == "rack1"
                and f"peer down: dc1/rack3 ({node3})" in a["summary"]
                for a in active
            )  # fmt: skip

        await until(naming_the_peer, "rack1's dropped-writes alert names rack3", timeout_s=60)


def _grown(before: str, after: str, family: str) -> dict[str, float]:
    old = per_replica(before, family)
    return {name: value - old.get(name, 0.0) for name, value in per_replica(after, family).items()}
