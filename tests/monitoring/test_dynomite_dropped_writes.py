"""Writes a real Dynomite drops, found from both sides and repaired (needs $REPLAG_DYNOMITE).

Under DC_ONE a write for a peer that is not connected is swallowed: Dynomite
logs it and counts it nowhere. With rack3's dynomite stopped (its Redis still
up), writes through rack1 never reach rack3; when it comes back the keys stay
missing there. The dropped-writes rule must fire, `repair check` must find
exactly those keys on exactly that rack, and `repair run` must put them back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx

from replag.alerts.evaluate import evaluate_and_notify
from replag.api.app import create_app
from replag.config import Config
from replag.monitoring.dropped_writes import DROPPED_WRITES_MESSAGE, find_dropped_writes
from replag.monitoring.dynomite_stats import collect_dynomite_stats
from replag.probes import run_probe
from replag.repair import check, repair
from replag.store import Store
from tests.helpers.dynomite_cluster import DynomiteCluster, DynomiteFactory, resp2_client
from tests.helpers.waiting import until

GROUP = "token-12345678"
# How long a probe waits for its keys: the healthy racks must get every one (lost 0 is
# the meaning asserted), and a busy host can hold a write back well past 0.5 s; only the
# rack that never gets them costs the whole wait.
HEALTHY_RACKS_WAIT_S = 3.0
RULE = (
    '\n[[alerts.rules]]\nname = "dynomite-drops"\nkind = "dynomite_dropped_writes"\n'
    'over = "10m"\nseverity = "critical"\n'
)


async def discovered(cluster: DynomiteCluster, tmp_path: Path) -> Config:
    return await cluster.discovered_config(
        tmp_path / "dyn.toml", extra=RULE, REPLAG_STORE=str(tmp_path / "s.sqlite")
    )


async def test_a_rack_that_missed_writes_is_alerted_found_and_repaired(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    cluster = dynomite_factory()
    config = await discovered(cluster, tmp_path)
    store = Store(config.settings.store)
    urls = list(config.settings.dynomite_stats_urls)
    node1, node3 = cluster.node("node1"), cluster.node("node3")
    try:
        baseline = await collect_dynomite_stats(urls, store=store, timeout_s=5)
        assert baseline.errors == {} and len(baseline.samples) == 3

        node3.stop()
        with resp2_client(node1.client_port) as client:
            for i in range(50):
                assert client.set(f"user:{i}", f"v{i}")
        # replag's own probe through rack1 sees rack3 miss every write.
        probe = await run_probe(
            config, count=20, rate=0, timeout_s=HEALTHY_RACKS_WAIT_S, store=store
        )
        assert [(p.replica, p.lost) for p in probe.pairs] == [
            ("dc1-rack1", 0),
            ("dc1-rack2", 0),
            ("dc1-rack3", 20),
        ]

        # /info is refreshed every stats_interval: collect until node1's shows the outage
        # (rack3 still down: it answers no /info).
        async def node1_saw_it() -> bool:
            await collect_dynomite_stats(urls, store=store, timeout_s=5)
            return node1.stats_url in {f.node for f in find_dropped_writes(store)}

        await until(node1_saw_it, "node1's /info shows its link to rack3 failing")

        # The notification names the peer that is down now, though it went down less than
        # the rule's `over` (10 min) ago.
        outcome = await evaluate_and_notify(config, store)
        firing = {
            tuple(sorted(e.labels.items())): e for e in outcome.events if e.status == "firing"
        }
        by_node = {dict(k).get("node"): e for k, e in firing.items()}
        assert node1.stats_url in by_node, outcome.to_dict()
        assert "peer link failures" in by_node[node1.stats_url].summary
        assert DROPPED_WRITES_MESSAGE in by_node[node1.stats_url].summary
        assert f"(peer down: dc1/rack3 ({node3.stats_url}))" in by_node[node1.stats_url].summary
        assert node3.stats_url not in by_node  # its own start-up refusals are not an outage
        cluster.restart(node3)  # back, every peer link up again: nothing replays the writes
        [rack3] = [e for k, e in firing.items() if dict(k).get("replica") == "dc1-rack3"]
        assert rack3.value == 20 and "missed 20 of 20 probe writes" in rack3.summary

        found = await check(config, group=GROUP, store=store)
        assert found.divergent == 50
        keys = found.to_dict()["divergent_keys"]
        assert sorted(k["key"] for k in keys) == sorted(f"user:{i}" for i in range(50))
        assert {k["kind"] for k in keys} == {"missing"}
        assert all(_missing_on(k) == ["dc1-rack3"] for k in keys), keys[0]

        fixed = await repair(config, group=GROUP, store=store)
        assert fixed.to_dict()["repaired"] == 50
        with node3.backend.client() as rack3_redis:
            assert rack3_redis.mget([f"user:{i}" for i in range(50)]) == [
                f"v{i}".encode() for i in range(50)
            ]
        assert (await check(config, group=GROUP, store=store)).divergent == 0

        # A whole `over` later without drops (a 2 s rule here), every node answering: the
        # alerts resolve saying so, never "no longer evaluated" (they still are).
        await asyncio.sleep(2.5)
        await collect_dynomite_stats(urls, store=store, timeout_s=5)
        short = _with_over(config, 2.0)
        resolved = [e for e in (await evaluate_and_notify(short, store)).events
                    if e.status == "resolved"]  # fmt: skip
        assert {dict(e.labels).get("node") for e in resolved} >= {node1.stats_url}, resolved
        assert all("no longer evaluated" not in e.summary for e in resolved), resolved
        (node1_resolved,) = [e for e in resolved if dict(e.labels).get("node") == node1.stats_url]
        assert "no peer link failure or dropped request in the last 2 s" in node1_resolved.summary
    finally:
        store.close()


def _with_over(config: Config, over_s: float) -> Config:
    rules = tuple(dataclasses.replace(r, over_s=over_s) for r in config.alerts.rules)
    return dataclasses.replace(config, alerts=dataclasses.replace(config.alerts, rules=rules))


def _missing_on(key: dict[str, Any]) -> list[str]:
    """The replicas on which a divergent key is absent, from the check's per-replica states."""
    return sorted(name for name, state in key["replicas"].items() if not state["exists"])


async def test_serve_collects_every_real_nodes_info(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    cluster = dynomite_factory()
    config = await cluster.discovered_config(
        tmp_path / "dyn.toml",
        REPLAG_STORE=str(tmp_path / "s.sqlite"),
        REPLAG_PROBE_INTERVAL="200ms",
        REPLAG_CHECK_INTERVAL="1h",
    )
    app = create_app(config)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replag")
        )

        async def dynomite() -> Any:
            response = await client.get("/api/v1/dynomite")
            assert response.status_code == 200, response.text
            return response.json()

        async def all_connected() -> bool:
            nodes = (await dynomite())["nodes"]
            return len(nodes) == 3 and all(n["peer_connections"] == 2 for n in nodes)

        await until(all_connected, "three nodes read, each with both peer links up")
        body = await dynomite()
        assert body["errors"] == [] and body["dropped_writes"] == []
        assert sorted((n["dc"], n["rack"]) for n in body["nodes"]) == [
            ("dc1", f"rack{i}") for i in (1, 2, 3)
        ]
        metrics = (await client.get("/metrics")).text
        assert "replag_dynomite_peer_dropped_requests_total{" in metrics
        json.dumps(body)  # what the dashboard reads is plain JSON
