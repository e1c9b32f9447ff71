"""Probes and repair checks running on discovered topologies: the lab, real replicas, a Cluster.

What discovery writes must be what the probe and repair read: each test
discovers, writes the TOML, loads it back and runs the real thing on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from replag.config import Config, load_config
from replag.discovery import Discovery
from replag.discovery.cluster import discover_cluster
from replag.discovery.dynomite import Address, NodePorts, PortMap, discover_dynomite
from replag.discovery.replication import discover_replication
from replag.errors import EXIT_UNREACHABLE, RepairError
from replag.probes import ProbeReport, run_probe
from replag.repair import check
from tests.helpers.dynomite_admin import admin_server, node_routes
from tests.helpers.lab import LabFactory
from tests.helpers.redis_cluster import RedisClusterNodes, start_cluster
from tests.helpers.redis_servers import RedisFactory


def written_and_loaded(found: Discovery, path: Path) -> Config:
    path.write_text(found.render())
    return load_config(path, environ={})


async def probe(config: Config, source: str | None = None) -> ProbeReport:
    return await run_probe(config, source=source, count=20, rate=0.0, timeout_s=3.0)


async def divergent_after_check(config: Config, group: str) -> int:
    report = await check(config, group=group)
    assert report.status == "done", report.to_dict()
    return report.divergent


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisClusterNodes]:
    cluster = start_cluster(tmp_path / "cluster")
    yield cluster
    cluster.stop()


async def test_lab_discovered_from_its_primary_is_probed_and_checked(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    state = lab_factory(regions=("a", "b"), delays_ms={"b": 2})
    primary = next(p for p in state["processes"] if p["role"] == "primary")
    replicas = {p["port"] for p in state["processes"] if p["role"] == "replica"}
    found = await discover_replication(f"redis://127.0.0.1:{primary['port']}", timeout_s=5)
    config = written_and_loaded(found, tmp_path / "lab.toml")
    assert {r.port for r in config.topology.regions[0].replicas} == replicas

    report = await probe(config)
    assert report.unreachable == []
    assert sorted((p.sent, p.seen, p.lost) for p in report.pairs) == [(20, 20, 0)] * 2

    group = f"127.0.0.1:{primary['port']}"  # the set is named after its primary
    assert await divergent_after_check(config, group) == 0
    # A write straight to one replica (made writable) is divergence the check must find.
    with redis.Redis(port=sorted(replicas)[0]) as client:
        client.config_set("replica-read-only", "no")
        client.set("user:9", "only here")
    assert await divergent_after_check(config, group) == 1


async def test_cluster_shards_are_probed_including_one_whose_replica_is_down(
    redis_cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    found = await discover_cluster(redis_cluster.url, timeout_s=5)
    config = written_and_loaded(found, tmp_path / "cluster.toml")
    for region in config.topology.regions:
        report = await probe(config, region.name)
        assert report.unreachable == [], region.name
        ((sent, seen),) = [(p.sent, p.seen) for p in report.pairs]
        assert (sent, seen) == (20, 20), region.name

    down = redis_cluster.replicas[1]
    down.kill()
    shard = config.topology.regions[1]
    report = await probe(config, shard.name)
    assert [u["replica"] for u in report.unreachable] == [f"127.0.0.1:{down.port}"]
    assert report.exit_code == EXIT_UNREACHABLE
    healthy = await probe(config, config.topology.regions[0].name)
    assert healthy.unreachable == [] and healthy.exit_code == 0

    # Repair per shard: a healthy shard compares clean; the one missing a replica says so.
    assert await divergent_after_check(config, config.topology.groups[0].name) == 0
    with pytest.raises(RepairError) as err:
        await check(config, group=shard.name)
    assert err.value.where is not None and str(down.port) in err.value.where


async def test_dynomite_replica_group_is_checked_on_the_racks_backends(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    # The captured 3-rack cluster, its backends mapped to real redis-servers: repair reads
    # them directly, as it would each rack's Redis (there is no Dynomite to go through).
    backends = [redis_factory(f"rack{i}") for i in (1, 2, 3)]
    overrides = {
        f"127.0.0.1:{peer}": NodePorts(
            client=Address("127.0.0.1", peer + 1),
            redis=Address("127.0.0.1", b.port),
            stats=Address("127.0.0.1", stats),
        )
        for peer, stats, b in zip((8101, 8111, 8121), (22222, 22232, 22242), backends, strict=True)
    }
    async with admin_server(node_routes("3rack", "node1")) as url:
        found = await discover_dynomite(url, ports=PortMap(overrides=overrides), timeout_s=5)
    config = written_and_loaded(found, tmp_path / "dynomite.toml")
    for backend in backends:
        with backend.client() as client:
            client.set("user:1", "alice")
    assert await divergent_after_check(config, "token-12345678") == 0
    # A write DC_ONE dropped on its way to rack3 (README: no hinted handoff).
    for backend in backends[:2]:
        with backend.client() as client:
            client.set("user:2", "bob")
    assert await divergent_after_check(config, "token-12345678") == 1
