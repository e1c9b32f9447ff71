"""Redis Cluster discovery against real `redis-server --cluster-enabled yes` nodes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from replag.config import load_config
from replag.discovery.cluster import (
    ClusterNode,
    Shard,
    discover_cluster,
    parse_cluster_shards,
    parse_cluster_slots,
)
from replag.errors import DiscoveryError
from replag.lab.binary import redis_server_version
from replag.lab.server import RedisServer
from tests.helpers.redis_cluster import RedisClusterNodes, cluster_command, start_cluster
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.server_kinds import KINDS, kind_binary, using_server_kind
from tests.helpers.waiting import until


@pytest.fixture(scope="module", params=KINDS)
def redis_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisClusterNodes]:
    """A live cluster of each server kind (its tests run once per kind, ids naming it)."""
    binary, missing = kind_binary(request.param)
    if binary is None:
        pytest.skip(f"server kind {request.param}: {missing}")
    with using_server_kind(binary):
        cluster = start_cluster(tmp_path_factory.mktemp("cluster"))
        try:
            yield cluster
        finally:
            cluster.stop()


async def test_every_shard_becomes_a_region_and_a_replica_group(
    redis_cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    found = await discover_cluster(redis_cluster.url, timeout_s=5)
    regions = found.topology.regions
    # Named by what a failover leaves as it was (the shard id, else the lowest slot), in
    # slot order; its identity (the shard id, else the lowest node id) to follow it by.
    identities = [
        _identity(primary, replica)
        for primary, replica in zip(redis_cluster.primaries, redis_cluster.replicas, strict=True)
    ]
    names = [
        f"shard-{i[:8]}" if _shard_id(p) else f"shard-{slots[0]}"
        for i, p, slots in zip(
            identities, redis_cluster.primaries, redis_cluster.slots, strict=True
        )
    ]
    assert [(r.name, r.shard) for r in regions] == list(zip(names, identities, strict=True))
    for region, primary, replica, slots in zip(
        regions, redis_cluster.primaries, redis_cluster.replicas, redis_cluster.slots, strict=True
    ):
        assert region.write is not None and region.write.port == primary.port
        assert [r.port for r in region.replicas] == [replica.port]
        assert region.slots == (slots,)
    groups = found.topology.groups
    assert [(g.name, [m.port for m in g.members], g.slots) for g in groups] == [
        (r.name, [r.write.port, *(x.port for x in r.replicas)], r.slots)
        for r in regions
        if r.write is not None
    ]
    assert found.facts["cluster_state"] == "ok" and found.facts["slots_covered"] == 16384
    expected = "CLUSTER SHARDS" if redis_server_version() >= (7, 0, 0) else "CLUSTER SLOTS"
    assert found.facts["command"] == expected

    path = tmp_path / "cluster.toml"
    path.write_text(found.render())
    assert f"Discovered from {expected}" in path.read_text()
    assert load_config(path, environ={}).topology.to_dict() == found.topology.to_dict()


async def test_any_node_gives_the_same_shards(redis_cluster: RedisClusterNodes) -> None:
    from_primary = await discover_cluster(redis_cluster.url, timeout_s=5)
    from_replica = await discover_cluster(redis_cluster.replicas[2].url, timeout_s=5)
    assert from_replica.topology.to_dict() == from_primary.topology.to_dict()


async def test_cluster_shards_when_the_server_has_it(redis_cluster: RedisClusterNodes) -> None:
    if redis_server_version() < (7, 0, 0):
        pytest.skip(f"redis-server {redis_server_version()} has no CLUSTER SHARDS")
    with redis_cluster.primaries[0].client() as client:
        reply = client.execute_command("CLUSTER", "SHARDS")
        slots_reply = client.execute_command("CLUSTER", "SLOTS")
    from_shards = parse_cluster_shards(reply, seed_host="127.0.0.1", where="t")
    from_slots = parse_cluster_slots(slots_reply, seed_host="127.0.0.1", where="t")
    # The same shards; CLUSTER SHARDS may also give each one's id (Valkey 8+, Redis 7.2+).
    unnamed = [replace(s, shard_id=None) for s in from_shards]
    assert sorted(unnamed, key=lambda s: s.slots) == sorted(from_slots, key=lambda s: s.slots)


def test_cluster_shards_replies_are_parsed() -> None:
    # A CLUSTER SHARDS reply in the RESP2 shape Redis 7.0 sends (flat key/value lists).
    reply = [
        [
            b"slots",
            [0, 100, 200, 300],
            b"nodes",
            [
                [
                    b"id",
                    b"aaa",
                    b"port",
                    7000,
                    b"ip",
                    b"10.0.0.1",
                    b"endpoint",
                    b"10.0.0.1",
                    b"role",
                    b"master",
                    b"replication-offset",
                    10,
                    b"health",
                    b"online",
                ],
                [
                    b"id",
                    b"bbb",
                    b"port",
                    7001,
                    b"ip",
                    b"",
                    b"endpoint",
                    b"?",
                    b"role",
                    b"replica",
                    b"replication-offset",
                    10,
                    b"health",
                    b"failed",
                ],
            ],
        ],
        [
            b"slots",
            [],
            b"nodes",
            [
                [
                    b"id",
                    b"ccc",
                    b"port",
                    7002,
                    b"ip",
                    b"10.0.0.3",
                    b"role",
                    b"master",
                    b"health",
                    b"online",
                ]
            ],
        ],
    ]
    (shard,) = parse_cluster_shards(reply, seed_host="seed", where="t")
    assert shard == Shard(
        slots=((0, 100), (200, 300)),
        primary=ClusterNode(node_id="aaa", host="10.0.0.1", port=7000),
        replicas=(ClusterNode(node_id="bbb", host="seed", port=7001, health="failed"),),
    )
    with pytest.raises(DiscoveryError, match="has no primary"):
        parse_cluster_shards([[b"slots", [0, 1], b"nodes", []]], seed_host="s", where="t")
    with pytest.raises(DiscoveryError, match="odd slot list"):
        parse_cluster_shards([[b"slots", [0], b"nodes", []]], seed_host="s", where="t")


async def test_a_server_without_cluster_support_is_a_clear_error(
    redis_factory: RedisFactory,
) -> None:
    plain = redis_factory("plain")
    with pytest.raises(DiscoveryError, match="not a Redis Cluster node") as err:
        await discover_cluster(plain.url, timeout_s=5)
    assert err.value.where == plain.url


async def test_names_stay_while_a_node_is_dead_and_after_a_failover(
    server_kind: str, tmp_path: Path
) -> None:
    """Discovered again, with no file to keep names from, while a replica is dead and then
    after another shard's primary died and its replica took over: every shard keeps its
    name (Redis 7.0 has no shard id, and a name by the lowest node id changed when that
    node died: the kills are chosen so it would)."""
    cluster = start_cluster(tmp_path)
    try:
        before = await discover_cluster(cluster.url, timeout_s=5)
        names = [(r.name, r.slots) for r in before.topology.regions]
        ids = [
            (_myid(p), _myid(r)) for p, r in zip(cluster.primaries, cluster.replicas, strict=True)
        ]
        # Shard 0 holds the seed; of the others, the primary dies where its id is the lower.
        fails = next((i for i in (1, 2) if ids[i][0] < ids[i][1]), 2)
        dies = 3 - fails
        cluster.replicas[dies].kill()
        await until(
            lambda: asyncio.to_thread(_flagged_fail, cluster, ids[dies][1]), "replica failed"
        )
        with_dead = await discover_cluster(cluster.url, timeout_s=5)
        assert [(r.name, r.slots) for r in with_dead.topology.regions] == names
        cluster.primaries[fails].kill()
        heir = cluster.replicas[fails]
        await until(lambda: asyncio.to_thread(_serves, cluster, heir.port), "a replica took over")
        after = await discover_cluster(cluster.url, timeout_s=5)
        assert [(r.name, r.slots) for r in after.topology.regions] == names
        moved = after.topology.regions[fails]
        assert moved.write is not None and moved.write.port == heir.port
        kept = "shard id" if _shard_id(cluster.primaries[0]) else "lowest slot"
        assert f"named by its {kept}" in after.render()
    finally:
        cluster.stop()


def _myid(node: RedisServer) -> str:
    with node.client() as c:
        return str(cluster_command(c, "MYID").decode())


def _flagged_fail(cluster: RedisClusterNodes, node_id: str) -> bool:
    with cluster.primaries[0].client() as c:
        lines = cluster_command(c, "NODES").decode().splitlines()
    return any(line.startswith(node_id) and "fail" in line.split()[2] for line in lines)


def _serves(cluster: RedisClusterNodes, port: int) -> bool:
    """Whether the seed lists the node at `port` as a primary serving slots."""
    with cluster.primaries[0].client() as c:
        return any(int(row[2][1]) == port for row in cluster_command(c, "SLOTS"))


def _shard_id(node: RedisServer) -> str | None:
    with node.client() as c:
        try:
            return str(cluster_command(c, "MYSHARDID").decode())
        except redis.ResponseError:
            return None


def _identity(primary: RedisServer, replica: RedisServer) -> str:
    """The shard's id where the server has one (CLUSTER MYSHARDID), else its lowest node id."""
    with primary.client() as p, replica.client() as r:
        try:
            return str(cluster_command(p, "MYSHARDID").decode())
        except redis.ResponseError:
            return min(cluster_command(c, "MYID").decode() for c in (p, r))
