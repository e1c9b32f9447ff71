"""An undo through an agent: a copy a client changed in place is reported, never guessed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio as aioredis
import tomli_w

from replag.config import load_config
from replag.lab.server import free_port
from replag.repair import repair
from tests.helpers.agent import start_agent, stop_agent
from tests.helpers.redis_servers import RedisFactory


async def test_a_copy_changed_in_place_before_an_undo_through_an_agent_is_reported_busy(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # c (behind an agent) lacks the hash. Once the repair's copy lands there, a client
    # deletes the hash on a and b and writes a field on c's copy, then on a and b. The
    # agent cannot replay that field onto the old value, so the undo must not guess:
    # the key is counted `undo_failed` and reported busy.
    servers = {r: redis_factory(r) for r in "abc"}
    port = free_port()
    data = {
        "settings": {
            "api_token": "undo-t0ken",
            "store": str(tmp_path / "replag.sqlite"),
            "repair_settle": "300ms",
            "agent_state_dir": str(tmp_path / "agents"),
            "allow_config_changes": True,
        },
        "regions": [
            {"name": "a", "replicas": [{"name": "a-1", "url": servers["a"].url}]},
            {"name": "b", "replicas": [{"name": "b-1", "url": servers["b"].url}]},
            {
                "name": "c",
                "agent": f"http://127.0.0.1:{port}",
                "replicas": [
                    {
                        "name": "c-1",
                        "url": f"redis://127.0.0.1:{free_port()}",  # reached only via the agent
                        "local": servers["c"].url,
                    }
                ],
            },
        ],
        "groups": [{"name": "g", "members": ["a-1", "b-1", "c-1"]}],
    }
    path = tmp_path / "topology.toml"
    path.write_text(tomli_w.dumps(data))
    a, b, c = (aioredis.Redis(port=servers[r].port) for r in "abc")
    await a.hset("h", mapping={"old1": "1", "old2": "1"})
    await b.hset("h", mapping={"old1": "1", "old2": "1"})
    await c.config_set("notify-keyspace-events", "Kg$")
    pubsub = c.pubsub()
    await pubsub.subscribe("__keyspace@0__:h")

    async def delete_then_write() -> None:
        async for message in pubsub.listen():
            if message["type"] == "message" and message["data"] == b"restore":
                break
        for client in (a, b):
            await client.delete("h")
        for client in (c, a, b):
            await client.hset("h", "new", "2")

    agent = start_agent(path, "c", port, tmp_path / "agent-c.log")
    try:
        writer = asyncio.create_task(delete_then_write())
        report = (await repair(load_config(path))).to_dict()
        await asyncio.wait_for(writer, 30)
    finally:
        stop_agent(agent)
    assert report["undo_failed"] == 1 and report["repaired"] == 0
    (key,) = report["divergent_keys"]
    assert key["status"] == "busy" and "in place" in key["reason"]
    # The client's writes stand everywhere (a later round may copy a's hash over c's).
    assert [await x.hgetall("h") for x in (a, b)] == [{b"new": b"2"}] * 2
    assert await c.hget("h", "new") == b"2"
    await pubsub.aclose()
    for client in (a, b, c):
        await client.aclose()
