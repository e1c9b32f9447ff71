"""INFO replication discovery against real redis-server primaries, replicas, chained replicas."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from replag.config import load_config
from replag.discovery.replication import discover_replication
from replag.errors import AuthError, UnreachableError, UsageError
from replag.lab.server import RedisServer, free_port
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed


@pytest.fixture
def tree(redis_factory: RedisFactory) -> dict[str, RedisServer]:
    """primary ← a, b; a ← chained."""
    primary = redis_factory("primary")
    a = replica_of(redis_factory, primary, "a")
    b = replica_of(redis_factory, primary, "b")
    chained = replica_of(redis_factory, a, "chained")
    wait_listed(primary, [a, b])
    wait_listed(a, [chained])
    return {"primary": primary, "a": a, "b": b, "chained": chained}


async def test_follows_every_replica_including_chained_ones(
    server_kind: str, tree: dict[str, RedisServer], tmp_path: Path
) -> None:
    found = await discover_replication(tree["primary"].url, timeout_s=5)
    (region,) = found.topology.regions
    # Named after what it is: the primary's host:port (two replica sets never share a name).
    assert region.name == f"127.0.0.1:{tree['primary'].port}"
    assert region.write is not None and region.write.port == tree["primary"].port
    ports = [r.port for r in region.replicas]
    assert sorted(ports[:2]) == sorted([tree["a"].port, tree["b"].port])
    assert ports[2] == tree["chained"].port
    (group,) = found.topology.groups
    assert group.name == region.name
    assert [m.port for m in group.members] == [tree["primary"].port, *ports]
    assert found.facts == {"replicas": 3, "chained": 1}

    path = tmp_path / "replication.toml"
    path.write_text(found.render())
    text = path.read_text()
    assert f"chained replica: replicates from 127.0.0.1:{tree['a'].port}, not the primary" in text
    assert load_config(path, environ={}).topology.to_dict() == found.topology.to_dict()


async def test_starting_from_a_chained_replica_finds_the_same_tree(
    tree: dict[str, RedisServer],
) -> None:
    from_top = await discover_replication(tree["primary"].url, timeout_s=5)
    from_leaf = await discover_replication(tree["chained"].url, timeout_s=5)
    assert from_leaf.topology.to_dict() == from_top.topology.to_dict()


async def test_a_lone_primary_has_no_group(redis_factory: RedisFactory) -> None:
    primary = redis_factory("alone")
    found = await discover_replication(primary.url, timeout_s=5)
    assert found.topology.regions[0].replicas == ()
    assert found.topology.groups == ()
    assert "lists no replicas" in found.header


async def test_credentials_of_the_url_reach_the_replicas(redis_factory: RedisFactory) -> None:
    primary = redis_factory("secure", password="s3cret")
    replica = replica_of(redis_factory, primary, "secure-replica")
    wait_listed(primary, [replica])
    found = await discover_replication(primary.url, timeout_s=5)
    (member,) = found.topology.regions[0].replicas
    assert (member.port, member.password) == (replica.port, "s3cret")
    assert "s3cret" not in repr(found.topology)
    with pytest.raises(AuthError) as err:
        await discover_replication(f"redis://:wrong@127.0.0.1:{primary.port}", timeout_s=5)
    assert "wrong" not in str(err.value)


async def test_bad_urls_and_dead_servers_are_clear_errors() -> None:
    with pytest.raises(UsageError, match="--redis"):
        await discover_replication("http://127.0.0.1:6379", timeout_s=1)
    port = free_port()
    with pytest.raises(UnreachableError) as err:
        await discover_replication(f"redis://127.0.0.1:{port}", timeout_s=1)
    assert f"127.0.0.1:{port}" in str(err.value)


def test_redis_py_parses_slave_lines_as_dicts(redis_factory: RedisFactory) -> None:
    # discover_replication relies on redis-py turning `slave0:ip=…,port=…` into a dict.
    primary = redis_factory("p")
    replica = replica_of(redis_factory, primary, "r")
    wait_listed(primary, [replica])
    with redis.Redis(port=primary.port) as client:
        entry = client.info("replication")["slave0"]
    assert entry["port"] == replica.port and entry["ip"] == "127.0.0.1"
