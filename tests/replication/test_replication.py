"""Replication state against real servers: bytes behind, backlog headroom, resyncs, write rate."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from click.testing import CliRunner

from replag.cli import main
from replag.config import Config, load_config
from replag.lab.cluster import lab_fault
from replag.replication import (
    Backlog,
    PrimaryState,
    ReplicationInfo,
    ReplicationSampler,
    ReplicationSnapshot,
    replication_targets,
)
from replag.topology import Endpoint, Region, Topology
from replag.wire.resp import RespConnection, pack
from tests.helpers.lab import LabFactory
from tests.helpers.redis_cluster import RedisClusterNodes, start_cluster


def lab_config(state: dict[str, Any]) -> Config:
    return load_config(Path(state["dir"]) / "topology.toml", environ={})


def port_of(state: dict[str, Any], role: str, region: str | None = None) -> int:
    return int(
        next(
            p["port"]
            for p in state["processes"]
            if p["role"] == role and (region is None or p["region"] == region)
        )
    )


async def sample(config: Config) -> ReplicationSnapshot:
    targets, notes = replication_targets(config.topology)
    async with ReplicationSampler(timeout_s=2) as sampler:
        snapshot = await sampler.sample(targets)
    snapshot.notes += notes
    return snapshot


async def sample_until(
    config: Config, done: Callable[[PrimaryState], bool], *, timeout_s: float = 120
) -> PrimaryState:
    """Sample until `done(primary)`: waits on the servers' state, never on a sleep. The
    deadline only bounds a hang (a starved machine is slow, not wrong); passing it fails
    with the last sample rather than handing a state that was never reached to the test.

    The resync counters come from the primary's second read, after every replica's, so a
    replica seen caught up after a reconnect is always counted in them."""
    deadline = time.monotonic() + timeout_s
    while True:
        primary = (await sample(config)).primaries[0]
        if done(primary):
            return primary
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s:g}s; last sample {primary}")
        await asyncio.sleep(0.05)


def write(port: int, count: int, *, size: int = 100, prefix: str = "k") -> int:
    """SET `count` keys of `size` bytes; the RESP bytes that enter the replication stream."""
    with redis.Redis(port=port) as client:
        pipe = client.pipeline(transaction=False)
        for i in range(count):
            pipe.set(f"{prefix}{i}", b"x" * size)
        pipe.execute()
    return sum(len(pack(b"SET", f"{prefix}{i}", b"x" * size)) for i in range(count))


def replica(primary: PrimaryState, name: str) -> Any:
    return next(r for r in primary.replicas if r.replica == name)


async def test_bytes_behind_grows_while_partitioned_and_returns_to_zero(
    server_kind: str,
    lab_factory: LabFactory,
) -> None:
    state = lab_factory(regions=("a", "b"), delays_ms={"b": 2})
    config = lab_config(state)
    lab_fault(Path(state["dir"]), "b", "partition")
    written = write(port_of(state, "primary"), 200)
    # a-1 has every byte, and both ends of b-1's link have seen it go.
    primary = await sample_until(
        config,
        lambda p: (
            replica(p, "a-1").bytes_behind == 0
            and replica(p, "b-1").status == "link-down"
            and replica(p, "b-1").ack_offset is None
        ),
    )
    cut = replica(primary, "b-1")
    assert cut.status == "link-down" and not cut.link_up
    # Every byte written since the cut (plus at most the SELECT and a replication PING).
    assert written <= cut.bytes_behind <= written + 100
    assert cut.bytes_behind == primary.offset - cut.offset
    assert cut.ack_offset is None  # the primary no longer lists it
    more = write(port_of(state, "primary"), 100, prefix="m")
    later = await sample_until(config, lambda p: replica(p, "a-1").bytes_behind == 0)
    assert replica(later, "b-1").bytes_behind >= cut.bytes_behind + more
    assert replica(later, "a-1").status == "ok"

    lab_fault(Path(state["dir"]), "b", "heal")
    healed = await sample_until(
        config, lambda p: all(r.status == "ok" and r.bytes_behind == 0 for r in p.replicas)
    )
    for r in healed.replicas:
        assert (r.status, r.bytes_behind, r.bytes_uncertainty) == ("ok", 0, 0)
        assert r.backlog_headroom == healed.backlog_size and r.headroom_fraction == 1.0


async def test_backlog_headroom_falls_until_a_full_resync_and_the_counter_moves(
    server_kind: str,
    lab_factory: LabFactory,
) -> None:
    state = lab_factory(regions=("a", "b"), delays_ms={"b": 1}, backlog_bytes=16384)
    config = lab_config(state)
    lab_dir, primary_port = Path(state["dir"]), port_of(state, "primary")
    before = (await sample(config)).primaries[0]
    assert before.backlog_size == 16384
    assert replica(before, "b-1").headroom_fraction == 1.0

    # A short partition stays inside the backlog: the reconnect is a partial resync.
    lab_fault(lab_dir, "b", "partition")
    written = write(primary_port, 20)
    cut = await sample_until(config, lambda p: replica(p, "b-1").status == "link-down")
    headroom = replica(cut, "b-1").backlog_headroom
    assert headroom is not None and 0 < headroom <= 16384 - written
    lab_fault(lab_dir, "b", "heal")
    partial = await sample_until(
        config,
        lambda p: replica(p, "b-1").status == "ok" and replica(p, "b-1").bytes_behind == 0,
    )
    assert replica(partial, "b-1").status == "ok"
    assert partial.sync_partial_ok == (before.sync_partial_ok or 0) + 1
    assert partial.sync_full == before.sync_full

    # A long one outruns it: headroom falls to 0, then below (bytes the replica needs are
    # gone from the backlog; Redis 7+ drops them in whole blocks, a little later than 6.2).
    lab_fault(lab_dir, "b", "partition")
    fractions, headrooms = [], []
    for batch in range(60):
        write(primary_port, 30, prefix=f"b{batch}-")
        cut = await sample_until(config, lambda p: replica(p, "b-1").status == "link-down")
        fractions.append(replica(cut, "b-1").headroom_fraction)
        headrooms.append(replica(cut, "b-1").backlog_headroom)
        if headrooms[-1] < 0:
            break
    assert fractions == sorted(fractions, reverse=True) and fractions[0] < 1.0
    assert headrooms[-1] < 0 and fractions[-1] == 0.0
    assert cut.sync_full == before.sync_full  # nothing has happened yet
    lab_fault(lab_dir, "b", "heal")
    resynced = await sample_until(
        config,
        lambda p: replica(p, "b-1").status == "ok" and replica(p, "b-1").bytes_behind == 0,
    )
    assert resynced.sync_full == (before.sync_full or 0) + 1
    assert resynced.sync_partial_ok == partial.sync_partial_ok
    with redis.Redis(port=port_of(state, "replica", "b")) as client:
        assert client.get(f"b{batch}-29") == b"x" * 100


async def test_write_rate_is_the_offset_growth_between_samples(lab_factory: LabFactory) -> None:
    state = lab_factory(regions=("a",))
    config = lab_config(state)
    targets, _ = replication_targets(config.topology)
    async with ReplicationSampler(timeout_s=2) as sampler:
        first = (await sampler.sample(targets)).primaries[0]
        assert first.write_rate_bps is None  # one sample has no rate
        written = write(port_of(state, "primary"), 500)
        second = (await sampler.sample(targets)).primaries[0]
    assert second.offset is not None and first.offset is not None
    assert second.offset - first.offset >= written
    assert second.write_rate_bps is not None and second.write_rate_bps > 0


async def test_each_cluster_shard_is_sampled_with_its_own_replica(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path / "cluster", primaries=2)
    try:
        topology = _cluster_topology(cluster)
        targets, notes = replication_targets(topology)
        assert not notes
        assert [[ep.port for _, ep in t.replicas] for t in targets] == [
            [r.port] for r in cluster.replicas
        ]
        async with ReplicationSampler(timeout_s=2) as sampler:
            snapshot = await sampler.sample(targets)
        assert snapshot.commands == 2 * 4  # per shard: INFO ×2 + stats on the primary, 1 replica
        for primary in snapshot.primaries:
            assert primary.error is None
            (only,) = primary.replicas
            assert only.status == "ok" and only.bytes_behind is not None
    finally:
        cluster.stop()


def _cluster_topology(cluster: RedisClusterNodes) -> Topology:
    return Topology(
        regions=tuple(
            Region(
                name=f"shard-{start}",
                write=Endpoint.from_url(primary.url, name=f"p{start}"),
                replicas=(Endpoint.from_url(rep.url, name=f"r{start}"),),
                slots=((start, end),),
            )
            for primary, rep, (start, end) in zip(
                cluster.primaries, cluster.replicas, cluster.slots, strict=True
            )
        )
    )


def test_dynomite_regions_say_the_probe_is_the_only_measure() -> None:
    dyno = Endpoint.from_url("redis://127.0.0.1:8102", name="dc1", kind="dynomite")
    backend = Endpoint.from_url("redis://127.0.0.1:22122", name="dc1-backend")
    topology = Topology(regions=(Region(name="dc1", write=dyno, replicas=(backend,)),))
    targets, notes = replication_targets(topology)
    assert targets == []
    assert notes == [
        "dc1 writes through Dynomite: its backends have no replication offsets; "
        "the probe is the only measure"
    ]


async def test_unreachable_replica_is_reported_not_raised(lab_factory: LabFactory) -> None:
    config = lab_config(lab_factory(regions=("a",)))
    gone = Endpoint.from_url("redis://127.0.0.1:1", name="gone")
    region = Region(name="a", write=config.topology.regions[0].write, replicas=(gone,))
    config = dataclasses.replace(config, topology=Topology(regions=(region,)))
    primary = (await sample(config)).primaries[0]
    (only,) = primary.replicas
    assert only.status == "unreachable" and only.error and "unreachable" in only.error


async def test_a_dead_primary_keeps_its_replicas_with_their_link_down(
    lab_factory: LabFactory,
) -> None:
    state = lab_factory(regions=("a", "b"), delays_ms={"b": 1})
    config = lab_config(state)
    primary_port = port_of(state, "primary")
    with redis.Redis(port=primary_port) as p:
        p.shutdown(nosave=True)
    down = await sample_until(
        config, lambda p: p.error is not None and all(not r.link_up for r in p.replicas)
    )
    assert down.replicas, down  # never "replicas: []" while they are there
    assert {r.status for r in down.replicas} == {"link-down"}, down.replicas
    assert all(r.link_status == "down" for r in down.replicas)


async def raw_info(port: int) -> bytes:
    conn = await RespConnection.open(Endpoint.from_url(f"redis://127.0.0.1:{port}"), timeout_s=2)
    try:
        return bytes(await conn.checked("INFO", "replication"))
    finally:
        await conn.close()


async def test_real_info_answers_parse(lab_factory: LabFactory) -> None:
    state = lab_factory(regions=("a",))
    primary = ReplicationInfo.parse(await raw_info(port_of(state, "primary")), where="p")
    replica_ = ReplicationInfo.parse(await raw_info(port_of(state, "replica")), where="r")
    assert primary.is_primary and primary.backlog_active and len(primary.listed) == 1
    assert not replica_.is_primary and replica_.link_status == "up"
    assert replica_.replid == primary.replid and replica_.applied_offset is not None
    assert primary.listed[0].state == "online"
    assert primary.listed[0].port == port_of(state, "replica")


def test_headroom_arithmetic() -> None:
    # A ring of 100 bytes holding offsets 401..500: a replica at 450 may fall 50 more behind.
    ring = Backlog(active=True, size=100, first_byte_offset=401, histlen=100)
    assert ring.headroom(primary_offset=500, replica_offset=450) == 50
    assert ring.headroom(primary_offset=500, replica_offset=400) == 0  # needs 401: the first
    assert ring.headroom(primary_offset=500, replica_offset=390) == -10  # 10 bytes already gone
    # Not full yet (histlen < size): the backlog grows before it drops anything.
    young = Backlog(active=True, size=100, first_byte_offset=1, histlen=30)
    assert young.headroom(primary_offset=30, replica_offset=10) == 80
    assert young.headroom_fraction(80) == 0.8
    # Redis 7 keeps whole blocks beyond the size: still held, but due at the next trim.
    blocks = Backlog(active=True, size=100, first_byte_offset=301, histlen=200)
    assert blocks.headroom(primary_offset=500, replica_offset=350) == 0
    assert (
        Backlog(active=False, size=100, first_byte_offset=0, histlen=0).headroom(
            primary_offset=5, replica_offset=0
        )
        is None
    )


def test_probe_reports_replication_per_pair_in_json_and_in_its_table(
    lab_factory: LabFactory,
) -> None:
    state = lab_factory(regions=("a", "b"), delays_ms={"b": 1})
    lab_dir = Path(state["dir"])
    lab_fault(lab_dir, "b", "partition")
    write(port_of(state, "primary"), 20)
    args = ["probe", "--config", str(lab_dir / "topology.toml"), "--count", "10", "--rate", "0"]
    args += ["--timeout", "300ms"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 1, result.output  # b lost every probe
    out = json.loads(result.output)
    pairs = {p["target"]: p["replication"] for p in out["pairs"]}
    assert pairs["a"]["status"] == "ok" and pairs["a"]["bytes_behind"] == 0
    assert pairs["b"]["status"] == "link-down" and not pairs["b"]["link_up"]
    assert pairs["b"]["bytes_behind"] >= 20 * 100 and pairs["b"]["link_down_s"] is not None
    (primary,) = out["replication"]["primaries"]
    assert primary["primary"] == "a-primary" and primary["resyncs"]["full"] >= 2
    assert [r["replica"] for r in primary["replicas"]] == ["a-1", "b-1"]
    assert out["replication"]["commands"] >= 2 * (3 + 2)  # sampled before and after

    table = CliRunner().invoke(main, args).output
    assert "replication of a (a-primary, offset " in table
    line = next(x for x in table.splitlines() if x.startswith("  b-1 "))
    assert "link-down" in line and "KiB" in line and "%" in line
