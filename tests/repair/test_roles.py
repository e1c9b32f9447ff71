"""Who is the primary of a replication group, read where each member is reached: here, or
by the agent of its region. A role nobody could read is never guessed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import tomli_w

from replag.config import load_config
from replag.lab.server import free_port
from replag.repair import repair
from replag.repair.decisions.roles import MemberRole, shape_of
from replag.topology import Endpoint, ReplicaGroup
from tests.helpers.agent import start_agent, stop_agent
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed
from tests.helpers.waiting import until

NO_AGENT_ANSWER = "its agent could not say: agent answered 404: Not Found"


def _group(kind: str) -> ReplicaGroup:
    members = tuple(Endpoint(name=n, host="127.0.0.1", port=p) for n, p in (("a", 1), ("b", 2)))
    return ReplicaGroup(name="g", members=members, kind=kind)


def test_a_replication_group_whose_primary_nobody_could_read_is_not_repaired() -> None:
    replica = MemberRole("slave", replid="r1", link_up=True, master="127.0.0.1:2")
    shape = shape_of(_group("replication"), [replica, MemberRole("unknown", error=NO_AGENT_ANSWER)])
    assert shape.primary is None and shape.no_primary is not None
    assert "b unknown: " + NO_AGENT_ANSWER in shape.no_primary


def test_an_auto_group_with_an_unreadable_member_is_never_taken_for_peers() -> None:
    # Peers would be written one by one: b may be a replica.
    primary = MemberRole("master", replid="r1")
    shape = shape_of(_group("auto"), [primary, MemberRole("unknown", error=NO_AGENT_ANSWER)])
    assert shape.kind == "replication" and shape.no_primary is not None
    assert "b (" + NO_AGENT_ANSWER + ")" in shape.no_primary


async def test_the_agent_names_the_primary_of_a_group_listed_replica_first(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # The primary sits behind its region's agent and is listed second: the group's first
    # member is a writable replica holding a stray key and a changed value. The agent
    # reads the primary's role, so the repair goes through it and replication carries
    # the fix (taking the first member as the primary would have kept the replica's).
    primary = redis_factory("p")
    stray = replica_of(redis_factory, primary, "w")
    wait_listed(primary, [stray])
    with stray.client() as w:
        w.config_set("replica-read-only", "no")
    with primary.client() as p:
        p.set("k", "primary's")
    await until(lambda: asyncio.to_thread(lambda: stray.client().get("k") is not None), "k")
    with stray.client() as w:
        w.set("k", "replica's")
        w.set("only-on-replica", "x")
    port = free_port()
    data = {
        "settings": {
            "api_token": "r0le-t0ken",
            "store": str(tmp_path / "replag.sqlite"),
            "repair_settle": "200ms",
            "agent_state_dir": str(tmp_path / "agents"),
            "allow_config_changes": True,
        },
        "regions": [
            {"name": "a", "replicas": [{"name": "a-1", "url": stray.url}]},
            {
                "name": "b",
                "agent": f"http://127.0.0.1:{port}",
                "replicas": [
                    {
                        "name": "b-1",
                        "url": f"redis://127.0.0.1:{free_port()}",  # reached only via the agent
                        "local": primary.url,
                    }
                ],
            },
        ],
        "groups": [{"name": "g", "kind": "replication", "members": ["a-1", "b-1"]}],
    }
    path = tmp_path / "topology.toml"
    path.write_text(tomli_w.dumps(data))
    agent = start_agent(path, "b", port, tmp_path / "agent-b.log")
    try:
        report = (await repair(load_config(path))).to_dict()
    finally:
        stop_agent(agent)
    (group,) = report["groups"]
    assert group["primary"] == "b-1", group
    assert report["repaired"] == 2 and report["errors"] == 0, report
    with stray.client() as w, primary.client() as p:
        assert w.get("k") == p.get("k") == b"primary's"
        assert w.exists("only-on-replica") == p.exists("only-on-replica") == 0
