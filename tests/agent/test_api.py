"""The agent's HTTP API in-process (real trees of a real server): token, answers, metrics."""

from __future__ import annotations

import base64
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from replag.agent.app import create_agent_app
from replag.agent.region import RegionAgent
from replag.config import Config, config_from_dict, render_config
from replag.errors import ConfigError
from replag.repair.scan.scanner import ScanIndex
from replag.repair.trees import remote
from tests.helpers.agent import AGENT_TIMEOUT_S
from tests.helpers.docs import docs_text
from tests.helpers.keyspace import fill, write_every_type
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.waiting import until

TOKEN = "agent-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _config(tmp_path: Path, url: str, *, token: str | None = TOKEN) -> Config:
    settings = {"store": str(tmp_path / "s.sqlite"), "agent_state_dir": str(tmp_path / "st")}
    if token:
        settings["api_token"] = token
    data = {
        "settings": settings,
        "regions": [
            {"name": "here", "agent": "http://127.0.0.1:1",
             "replicas": [{"name": "r", "url": url}]},
            {"name": "there", "replicas": [{"name": "o", "url": "redis://127.0.0.1:2"}]},
        ],
        "groups": [{"name": "g", "members": ["r", "o"]}],
    }  # fmt: skip
    return config_from_dict(data, where="test", environ={})


@pytest.fixture
async def client(redis_factory: RedisFactory, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    server = redis_factory("api", extra_args=("--notify-keyspace-events", "KA"))
    fill(server.client(), 3_000)
    write_every_type(server.client())
    agent = RegionAgent(_config(tmp_path, server.url), "here", poll_s=0.1)
    await agent.start()
    app = create_agent_app(agent, run=False)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://agent"
        ) as http:
            await until(
                lambda: agent.trees["r"].state == "current",
                "tree current",
                timeout_s=AGENT_TIMEOUT_S,
            )
            yield http
    finally:
        await agent.stop()


async def test_health_needs_no_token_and_everything_else_does(client: httpx.AsyncClient) -> None:
    health = await client.get("/agent/v1/health")
    assert health.status_code == 200 and health.json()["replicas"] == {"r": "current"}
    for method, path, body in [
        ("GET", "/agent/v1/replicas", None),
        ("GET", "/metrics", None),
        ("POST", "/agent/v1/replicas/r/nodes", {"level": 0, "nodes": [0], "down": 1}),
        ("POST", "/agent/v1/replicas/r/leaves", {"leaves": [0]}),
        ("POST", "/agent/v1/replicas/r/keys/observe", {"keys": []}),
    ]:
        assert (await client.request(method, path, json=body)).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (await client.request(method, path, json=body, headers=wrong)).status_code == 401
        assert (await client.request(method, path, json=body, headers=AUTH)).status_code == 200


async def test_nodes_leaves_and_key_states_describe_the_tree(client: httpx.AsyncClient) -> None:
    agent: RegionAgent = client._transport.app.state.agent  # type: ignore[attr-defined]
    tree = agent.trees["r"].tree
    assert tree is not None
    levels = tree.levels()
    answer = await client.post(
        "/agent/v1/replicas/r/nodes",
        json={"level": 0, "nodes": [0], "down": 12, "fresh": True, "wait_s": 5},
        headers=AUTH,
    )
    assert answer.headers[remote.DEPTH_HEADER] == "16"
    assert answer.headers[remote.KEYS_HEADER] == str(3_000 + 7)
    assert np.array_equal(np.frombuffer(answer.content, "<u8"), levels[12])
    # The walk's first question: the agent goes as deep as its 3,007 keys call for.
    auto = await client.post(
        "/agent/v1/replicas/r/nodes",
        json={"level": 0, "nodes": [0], "down": 16, "auto": True},
        headers=AUTH,
    )
    assert auto.headers[remote.DOWN_HEADER] == "8"
    assert np.array_equal(np.frombuffer(auto.content, "<u8"), levels[8])
    below = await client.post(
        "/agent/v1/replicas/r/nodes", json={"level": 12, "nodes": [5, 9], "down": 4}, headers=AUTH
    )
    assert np.array_equal(
        np.frombuffer(below.content, "<u8"),
        np.concatenate([levels[16][80:96], levels[16][144:160]]),
    )

    leaves = await client.post(
        "/agent/v1/replicas/r/leaves", json={"leaves": list(range(1 << 16))}, headers=AUTH
    )
    index = ScanIndex.from_bytes(leaves.content)
    names = {index.key(i) for i in range(len(index))}
    assert len(names) == 3_007 and b"\xff\xfe\x00bin-key" in names
    assert index.tree(16) == tree

    keys = [b"k:0000001", b"t:hash", b"missing"]
    states = await client.post(
        "/agent/v1/replicas/r/keys/observe",
        json={"keys": [base64.b64encode(k).decode() for k in keys], "settle_s": 0.01},
        headers=AUTH,
    )
    first, second = states.json()["first"], states.json()["second"]
    assert first == second
    assert first[0][0] == "string" and first[1][0] == "hash" and first[2] is None


async def test_bad_requests_are_4xx_naming_what_is_wrong(client: httpx.AsyncClient) -> None:
    unknown = await client.post(
        "/agent/v1/replicas/nope/leaves", json={"leaves": [1]}, headers=AUTH
    )
    assert unknown.status_code == 404 and "nope" in unknown.json()["detail"]
    deep = await client.post(
        "/agent/v1/replicas/r/nodes", json={"level": 10, "nodes": [0], "down": 10}, headers=AUTH
    )
    assert deep.status_code == 400 and "depth 16" in deep.json()["detail"]
    outside = await client.post(
        "/agent/v1/replicas/r/nodes", json={"level": 2, "nodes": [4], "down": 1}, headers=AUTH
    )
    assert outside.status_code == 400
    bad_key = await client.post(
        "/agent/v1/replicas/r/keys/observe", json={"keys": ["%%%"]}, headers=AUTH
    )
    assert bad_key.status_code == 400


async def test_metrics_show_trees_events_and_bytes(client: httpx.AsyncClient) -> None:
    agent: RegionAgent = client._transport.app.state.agent  # type: ignore[attr-defined]
    server_url = agent.trees["r"].endpoint
    import redis

    redis.Redis(host=server_url.host, port=server_url.port).set(b"k:0000002", b"new")
    await until(
        lambda: agent.trees["r"].stats.keys_applied >= 1,
        "the write applied",
        timeout_s=AGENT_TIMEOUT_S,
    )
    await client.post("/agent/v1/replicas/r/leaves", json={"leaves": [7]}, headers=AUTH)
    text = (await client.get("/metrics", headers=AUTH)).text
    assert 'replag_agent_tree_state{replica="r",state="current"} 1.0' in text
    assert 'replag_agent_tree_keys{replica="r"} 3007.0' in text
    assert 'replag_agent_events_total{replica="r"} 1.0' in text
    assert 'replag_agent_builds_total{replica="r"} 1.0' in text
    assert "replag_agent_tree_bytes_per_key" in text
    assert "replag_agent_replica_cpu_seconds_total" in text
    for family in (
        "tree_memory_bytes",
        "pending_keys",
        "build_seconds",
        "build_replica_cpu_seconds",
        "keys_applied_total",
        "restores_total",
    ):
        assert f'replag_agent_{family}{{replica="r"}}' in text, family
    assert 'replag_agent_restores_total{replica="r"} 0.0' in text  # built, not restored
    resident = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("replag_agent_resident_")
    }
    rss, fixed = (
        resident["replag_agent_resident_bytes"],
        resident["replag_agent_resident_fixed_bytes"],
    )
    # The marginal cost: what the agent holds beyond its size before any tree, per key
    # (none where the process shrank since: here the agent shares the test's process).
    assert rss > 10 << 20 and fixed > 10 << 20
    per_key = resident["replag_agent_resident_bytes_per_key"]
    assert per_key == pytest.approx(max(0.0, rss - fixed) / 3007, rel=0.05, abs=1.0)
    assert 'replag_agent_response_bytes_total{route="leaves"}' in text
    assert TOKEN not in text


async def test_an_agent_without_a_token_serves_only_health(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    server = redis_factory("notoken")
    agent = RegionAgent(_config(tmp_path, server.url, token=None), "here")
    app = create_agent_app(agent, run=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        assert (await c.get("/agent/v1/health")).status_code == 200
        assert (await c.get("/agent/v1/replicas", headers=AUTH)).status_code == 403


async def test_every_agent_route_and_metric_is_documented(client: httpx.AsyncClient) -> None:
    docs = docs_text()
    app = client._transport.app  # type: ignore[attr-defined]
    for path in app.openapi()["paths"]:
        assert f"`GET {path}" in docs or f"`POST {path}" in docs, path
    text = (await client.get("/metrics", headers=AUTH)).text
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert names
    for name in names:
        short = name.removeprefix("replag_agent")
        assert name in docs or f"`{short}" in docs, name


@pytest.mark.parametrize(
    ("region", "error"),
    [
        ({"agent": "ftp://x"}, "regions[0].agent: expected the agent's http:// or https:// URL"),
        (
            {"replicas": [{"url": "redis://10.0.0.1:6379", "local": "nope"}]},
            "regions[0].replicas[0].local: not a Redis URL",
        ),
    ],
)
def test_agent_config_errors_name_the_key(region: dict[str, object], error: str) -> None:
    data = {"regions": [{"name": "r", "replicas": ["redis://10.0.0.1:6379"], **region}]}
    with pytest.raises(ConfigError) as failed:
        config_from_dict(data, where="t.toml", environ={})
    assert error in str(failed.value)


def test_local_is_where_the_agent_connects() -> None:
    data = {
        "regions": [
            {
                "name": "r",
                "agent": "https://agent.r:8701/",
                "replicas": [
                    {"name": "x", "url": "redis://:pw@10.9.0.1:7000", "local": "redis://127.0.0.1:6379"}
                ],
            }
        ],
        "groups": [{"name": "g", "members": ["x", "redis://10.0.0.2:6379"]}],
    }  # fmt: skip
    config = config_from_dict(data, where="t.toml", environ={})
    member = config.topology.groups[0].members[0]
    assert (member.host, member.port) == ("10.9.0.1", 7000)
    local = member.in_region()
    assert (local.host, local.port, local.password) == ("127.0.0.1", 6379, "pw")
    assert config.topology.agent_of(member) == "https://agent.r:8701"
    assert config.topology.agent_of(config.topology.groups[0].members[1]) is None
    again = config_from_dict(tomllib.loads(render_config(config.topology)), where="", environ={})
    assert again.topology.groups[0].members[0].in_region() == local
    assert again.topology.regions[0].agent == "https://agent.r:8701"


async def test_repair_steps_run_by_the_agent_compare_before_they_write(
    client: httpx.AsyncClient,
) -> None:
    agent: RegionAgent = client._transport.app.state.agent  # type: ignore[attr-defined]
    endpoint = agent.trees["r"].endpoint
    import redis

    direct = redis.Redis(host=endpoint.host, port=endpoint.port)
    key = b"k:0000003"
    states = await client.post(
        "/agent/v1/replicas/r/keys/observe",
        json={"keys": [base64.b64encode(key).decode()], "once": True},
        headers=AUTH,
    )
    (held,) = states.json()["first"]
    assert "second" not in states.json()
    b64 = base64.b64encode(key).decode()

    read = await client.post(
        "/agent/v1/replicas/r/keys/read-for-copy",
        json={"key": b64, "expected": held, "tolerance_ms": 2000},
        headers=AUTH,
    )
    dump = base64.b64decode(read.json()["payload"])
    assert read.json()["pttl"] == -1 and dump == direct.dump(key)
    stale = ["string", "0000000000000000", None]
    refused = await client.post(
        "/agent/v1/replicas/r/keys/read-for-copy",
        json={"key": b64, "expected": stale, "tolerance_ms": 2000},
        headers=AUTH,
    )
    assert refused.json() == {"changed": True}

    other = base64.b64encode(b"k:0000004").decode()
    direct_value = direct.get(b"k:0000004")
    write = {"op": "restore", "payload": base64.b64encode(dump).decode(), "pttl": -1}
    not_written = await client.post(
        "/agent/v1/replicas/r/keys/write",
        json={"key": other, "expected": stale, "write": write, "age_ms": 0, "tolerance_ms": 2000},
        headers=AUTH,
    )
    assert not_written.json() == {"written": False} and direct.get(b"k:0000004") == direct_value
    (other_held,) = (
        await client.post(
            "/agent/v1/replicas/r/keys/observe",
            json={"keys": [other], "once": True},
            headers=AUTH,
        )
    ).json()["first"]
    written = await client.post(
        "/agent/v1/replicas/r/keys/write",
        json={
            "key": other,
            "expected": other_held,
            "write": write,
            "age_ms": 0,
            "tolerance_ms": 2000,
        },
        headers=AUTH,
    )
    answer = written.json()
    assert answer["written"] and answer["count"] == 1 and answer["pre_pttl"] == -1
    assert direct.get(b"k:0000004") == direct.get(key)
    assert base64.b64decode(answer["pre_image"]) != dump  # the old value, for an undo
