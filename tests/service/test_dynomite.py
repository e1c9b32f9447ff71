"""Dynomite /info in the service: collected on a schedule into the store, metrics, API and alerts.

Nodes are real HTTP servers answering with captured Dynomite output; a second
answer with a higher `peer_dropped_requests` stands for writes dropped meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from replag.alerts.evaluate import evaluate_and_notify
from replag.api.app import create_app
from replag.config import Config, config_from_dict
from replag.errors import ConfigError
from replag.lab.server import free_port
from replag.monitoring.dropped_writes import DROPPED_WRITES_MESSAGE
from replag.monitoring.dynomite_stats import collect_dynomite_stats
from replag.store import Store
from tests.helpers.dynomite_admin import Route, admin_server, fixture_bytes, node_routes
from tests.helpers.waiting import until

RULE = {"name": "dynomite-drops", "kind": "dynomite_dropped_writes", "over": "1s"}


def info_with(layout_node: str, **changes: int) -> bytes:
    """A node's captured /info with some dyn_o_mite counters changed."""
    info = json.loads(fixture_bytes(f"{layout_node}_info.json"))
    for key, value in changes.items():
        info["dyn_o_mite"][key] = value
    return json.dumps(info).encode()


def dynomite_config(
    tmp_path: Path, urls: list[str], rules: list[dict[str, Any]] | None = None
) -> Config:
    """No write endpoint and no groups: the Dynomite collector is the only scheduler."""
    data = {
        "settings": {
            "store": str(tmp_path / "s.sqlite"),
            "probe_interval": "100ms",
            "connect_timeout": "2s",
            "dynomite_stats_urls": urls,
        },
        "regions": [{"name": "dc1", "replicas": ["redis://127.0.0.1:1"]}],
        "alerts": {"rules": [RULE] if rules is None else rules},
    }
    return config_from_dict(data, where="replag.toml", environ={})


async def test_service_collects_into_store_metrics_api_and_alerts(tmp_path: Path) -> None:
    routes: list[dict[str, Route]] = [node_routes("3rack", n) for n in ("node1", "node2", "node3")]
    dead = f"http://127.0.0.1:{free_port()}"
    async with AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(admin_server(r)) for r in routes]
        app = create_app(dynomite_config(tmp_path, [*urls, dead]))
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replag")
        )

        async def get(path: str) -> Any:
            response = await client.get(path)
            assert response.status_code == 200, (path, response.text)
            return response.json() if path.startswith("/api") else response.text

        async def all_read() -> bool:
            body = await get("/api/v1/dynomite")
            return len(body["nodes"]) == 3 and len(body["errors"]) == 1

        await until(all_read, "three nodes read and one error")
        body = await get("/api/v1/dynomite")
        assert body["configured"] == 4 and body["dropped_writes"] == []
        node1 = next(n for n in body["nodes"] if n["node"] == urls[0])
        assert (node1["dc"], node1["rack"], node1["peer_dropped_requests"]) == ("dc1", "rack1", 0)
        assert node1["cross_zone_latency_p99_us"] == 217
        assert body["errors"][0]["node"] == dead and "unreachable" in body["errors"][0]["error"]
        assert {f["name"] for f in body["figures"]} >= {"peer_timedout_requests", "peer_in_queue"}

        metrics = await get("/metrics")
        labels = f'dc="dc1",node="{urls[0]}",rack="rack1"'
        assert f"replag_dynomite_peer_dropped_requests_total{{{labels}}} 0.0" in metrics
        assert f"replag_dynomite_cross_zone_latency_p99_seconds{{{labels}}} 0.000217" in metrics
        assert 'task="dynomite_stats"' in metrics and f'name="{urls[2]}"' in metrics
        assert f'replag_dynomite_stats_errors_total{{node="{dead}"}}' in metrics
        stored = app.state.service.store.execute("SELECT COUNT(DISTINCT node) FROM dynomite_stats")
        assert stored == [(3,)]

        # node1 starts dropping requests to its peers: the rule fires, naming it.
        routes[0]["/info"] = info_with("3rack_node1_22222", peer_dropped_requests=7)

        async def firing() -> list[dict[str, Any]]:
            active = (await get("/api/v1/alerts"))["active"]
            return [a for a in active if a["rule"] == "dynomite-drops" and a["status"] == "firing"]

        await until(lambda: _truthy(firing()), "the dropped-writes alert fires")
        [alert] = await firing()
        assert alert["labels"] == {
            "alertname": "dynomite-drops", "kind": "dynomite_dropped_writes",
            "severity": "warning", "node": urls[0], "dc": "dc1", "rack": "rack1",
        }  # fmt: skip
        assert DROPPED_WRITES_MESSAGE in alert["summary"] and "rack1" in alert["summary"]
        assert alert["value"] == 7
        metrics = await get("/metrics")
        assert f"replag_dynomite_peer_dropped_requests_total{{{labels}}} 7.0" in metrics

        # The counter stays at 7: once `over` (1 s) has no growth, the alert resolves.
        async def resolved() -> bool:
            history = (await get("/api/v1/alerts?history=200"))["history"]
            return any(h["rule"] == "dynomite-drops" and h["status"] == "resolved" for h in history)

        await until(resolved, "the dropped-writes alert resolves")
        assert await firing() == []
    assert "dynomite samples" in app.state.service.counters


async def _truthy(items: Awaitable[list[Any]]) -> bool:
    return bool(await items)


async def test_cron_path_fires_and_resolves_from_stored_samples(tmp_path: Path) -> None:
    """`topology dynomite-stats` fills the store; `probe --alerts` evaluates the same rule."""
    route: dict[str, Route] = node_routes("2dc", "node2")
    store = Store(tmp_path / "s.sqlite")
    rule = {**RULE, "over": "5m", "threshold": 3, "severity": "critical"}
    async with admin_server(route) as url:
        config = dynomite_config(tmp_path, [url], rules=[rule])

        async def sample_and_evaluate(*, dropped: int) -> Any:
            route["/info"] = info_with("2dc_node2_22262", remote_peer_dropped_requests=dropped)
            collected = await collect_dynomite_stats([url], store=store, timeout_s=5)
            assert collected.errors == {}
            return await evaluate_and_notify(config, store)

        first = await sample_and_evaluate(dropped=0)
        # Answering, nothing dropped: evaluated (inactive), so an alert resolves for a reason.
        assert [c.active for c in first.conditions] == [False] and first.events == []
        below = await sample_and_evaluate(dropped=2)  # within the threshold of 3
        assert [c.active for c in below.conditions] == [False] and below.events == []
        fired = await sample_and_evaluate(dropped=9)
        [event] = fired.events
        assert event.status == "firing" and event.value == 9
        assert event.labels["dc"] == "dc2" and event.labels["node"] == url
        assert DROPPED_WRITES_MESSAGE in event.summary
        assert "9 peer requests dropped" in event.summary  # 2 then 7 more: summed since
        # Six minutes pass without growth: the samples so far age, a fresh one arrives (a
        # node with no sample within `over` would be no data, which keeps the alert firing).
        store.execute("UPDATE dynomite_stats SET sampled_ns = sampled_ns - ?", (6 * 60 * 10**9,))
        later = await sample_and_evaluate(dropped=9)
        assert [e.status for e in later.events] == ["resolved"]
        assert (
            "no peer link failure or dropped request in the last 300 s" in later.events[0].summary
        )
    store.close()


@pytest.mark.parametrize(
    ("threshold", "message"), [("many", "non-negative number"), (-1, "non-negative number")]
)
def test_rule_threshold_is_a_count(tmp_path: Path, threshold: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        dynomite_config(tmp_path, [], rules=[{**RULE, "threshold": threshold}])
    assert "alerts.rules[0].threshold" in str(info.value)
