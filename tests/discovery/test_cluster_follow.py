"""Following a real Redis Cluster (3 primaries, 3 replicas; every server kind) through a
reshard and through killed shard primaries, under `probe --source all` and `serve`.

Shards are named by a stable identity, so a reshard changes neither their names nor
where their history is; each run re-reads CLUSTER SHARDS, so it writes into a slot the
shard holds now and to the primary it has now. The tests share one cluster per kind
and run in order: a reshard, then a primary killed under the probe, then another
killed under the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from replag.api.app import create_app
from replag.cli import main
from replag.config import Config, load_config
from replag.discovery.cluster import discover_cluster
from replag.discovery.primaries import failover_check
from replag.lab.server import RedisServer
from replag.probes.keys import hash_tag_for, key_slot
from replag.probes.progress import ProbeProgress
from replag.probes.runner import run_probe, run_probe_all
from replag.replication import history
from replag.store import Store
from tests.helpers.redis_cluster import RedisClusterNodes, cluster_command, start_cluster
from tests.helpers.server_kinds import KINDS, kind_binary, using_server_kind
from tests.helpers.waiting import until, wait_until

PROBE = {"count": 20, "rate": 0, "timeout_s": 3.0}


@pytest.fixture(scope="module", params=KINDS)
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisClusterNodes]:
    binary, missing = kind_binary(request.param)
    if binary is None:
        pytest.skip(f"server kind {request.param}: {missing}")
    with using_server_kind(binary):
        nodes = start_cluster(tmp_path_factory.mktemp("cluster"))
        try:
            yield nodes
        finally:
            nodes.stop()


@pytest.fixture(scope="module")
def store_path(cluster: RedisClusterNodes, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store per cluster (per server kind): shards of two kinds' clusters can have the
    same names (their lowest slots)."""
    return tmp_path_factory.mktemp("store") / "s.sqlite"


async def cluster_config(cluster: RedisClusterNodes, path: Path, store: Path, **env: str) -> Config:
    """What discovery finds now, from any live node, written and loaded."""
    live = next(n for n in cluster.nodes if n.pid is not None)
    found = await discover_cluster(live.url, timeout_s=5)
    await asyncio.to_thread(path.write_text, found.render())
    return load_config(path, environ={"REPLAG_STORE": str(store), **env})


def node_id(server: RedisServer) -> str:
    with server.client() as c:
        return str(cluster_command(c, "MYID").decode())


def owner(cluster: RedisClusterNodes, slot: int) -> set[str]:
    """The node id every live node says serves `slot` (one id once they agree)."""
    ids = set()
    for node in cluster.nodes:
        if node.pid is None:
            continue
        with node.client() as c:
            for start, end, primary, *_ in cluster_command(c, "SLOTS"):
                if start <= slot <= end:
                    ids.add(primary[2].decode())
    return ids


def move_slots(cluster: RedisClusterNodes, first: int, last: int, dest: RedisServer) -> None:
    """Reshard [first, last] to `dest` the way redis-cli does (keys migrated, if any)."""
    dest_id = node_id(dest)
    source = next(p for p in cluster.primaries if p.pid is not None and p is not dest)
    for slot in range(first, last + 1):
        holder = next(iter(owner(cluster, slot)))
        source = next(p for p in cluster.nodes if p.pid is not None and node_id(p) == holder)
        with source.client() as src, dest.client() as dst:
            cluster_command(dst, "SETSLOT", slot, "IMPORTING", holder)
            cluster_command(src, "SETSLOT", slot, "MIGRATING", dest_id)
            while keys := cluster_command(src, "GETKEYSINSLOT", slot, 100):
                src.execute_command("MIGRATE", "127.0.0.1", dest.port, "", 0, 5000, "KEYS", *keys)
            for node in (dst, src):
                cluster_command(node, "SETSLOT", slot, "NODE", dest_id)
    wait_until(lambda: all(owner(cluster, s) == {dest_id} for s in (first, last)),
               "every node sees the moved slots", timeout_s=30)  # fmt: skip


def windows_of(store: Path, source: str) -> int:
    with Store(store) as s:
        return len(s.windows(source=source))


async def test_a_reshard_keeps_the_shards_names_and_history(
    cluster: RedisClusterNodes, tmp_path: Path, store_path: Path
) -> None:
    config = await cluster_config(cluster, tmp_path / "before.toml", store_path)
    names = [r.name for r in config.topology.regions]
    assert all(n.startswith("shard-") and "-" not in n[6:] for n in names), names
    with Store(store_path) as store:
        before = await run_probe_all(config, store=store, **PROBE)
    assert before.exit_code == 0, before.render()
    # Move the slot shard 0's probe keys hash to (and its neighbours) to shard 1.
    first_region = config.topology.regions[0]
    slot = key_slot(hash_tag_for(first_region.slots).encode())
    move_slots(cluster, slot, slot + 9, cluster.primaries[1])
    with Store(store_path) as store:
        after = await run_probe_all(config, store=store, **PROBE)  # the config from before
    assert after.exit_code == 0, after.render()
    assert after.write_errors == 0  # no MOVED: the run wrote into a slot the shard holds now
    assert any(f"{first_region.name} holds slots" in n for n in after.notes), after.notes
    # Discovered again into a new file with the config in use as --previous: each shard
    # found by its identity keeps its name, though its lowest slot may have moved.
    path = tmp_path / "after.toml"
    argv = ["topology", "discover", "--cluster", cluster.url, "--out", str(path)]
    found = await asyncio.to_thread(
        CliRunner().invoke, main, [*argv, "--previous", str(tmp_path / "before.toml")]
    )
    assert found.exit_code == 0, found.output
    rediscovered = load_config(path, environ={"REPLAG_STORE": str(store_path)})
    assert [r.name for r in rediscovered.topology.regions] == names
    assert rediscovered.topology.regions[0].slots != first_region.slots
    for name in names:  # one window per replica per run, all under the same name
        assert windows_of(store_path, name) == 2

    # The slot moves again while a run writes: the refused writes say so, once.
    now_slot = key_slot(hash_tag_for(rediscovered.topology.regions[0].slots).encode())
    moved: list[int] = []

    def move_mid_run(progress: ProbeProgress) -> None:
        if progress.phase == "writing" and progress.done == 5 and not moved:
            moved.append(now_slot)
            move_slots(cluster, now_slot, now_slot, cluster.primaries[2])

    with Store(store_path) as store:
        mid = await run_probe(
            config, source=first_region.name, store=store, progress=move_mid_run, **PROBE
        )
    assert moved and mid.write_errors > 0
    assert any("slot moved during the run (MOVED/ASK)" in n for n in mid.notes), mid.notes


async def test_a_killed_shard_primary_is_followed_and_the_others_probed_throughout(
    cluster: RedisClusterNodes, tmp_path: Path, store_path: Path
) -> None:
    config = await cluster_config(cluster, tmp_path / "c.toml", store_path)
    shard = config.topology.regions[2]
    assert shard.write is not None
    victim = next(n for n in cluster.nodes if n.port == shard.write.port)
    others = [r.name for r in config.topology.regions if r.name != shard.name]
    with Store(store_path) as store:
        await run_probe_all(config, store=store, **PROBE)
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.pid = None

        async def followed() -> bool:
            report = await run_probe_all(config, store=store, **PROBE)
            # Whatever state the failover is in, the other shards are probed (the cluster
            # may refuse their writes, CLUSTERDOWN, until it fails over: reported, not fatal).
            assert set(others) <= {p.source for p in report.pairs}, report.render()
            return bool(report.failovers)

        await until(followed, "the probe follows the shard's failover", timeout_s=90)
        # Discovery again, its old primary dead, rewriting the file: every shard keeps its
        # name (without a shard id, Redis 6.2/7.0 named it by a node id that may be the dead
        # one's; its slots survive).
        path = tmp_path / "c.toml"
        live = next(n for n in cluster.nodes if n.pid is not None)
        again_found = await asyncio.to_thread(
            CliRunner().invoke,
            main,
            ["topology", "discover", "--cluster", live.url, "--out", str(path)],
        )
        assert again_found.exit_code == 0, again_found.output
        kept = load_config(path, environ={"REPLAG_STORE": str(store_path)}).topology
        assert [r.name for r in kept.regions] == [r.name for r in config.topology.regions]
        # failover-check with the config from before the kill: an answer about the promoted
        # replica (no replica of its own left: unsafe), the dead old primary a candidate
        # that cannot be promoted; not "primary unreachable" (exit 2).
        answer = await failover_check(config, source=shard.name)
        (dead,) = answer.assessments
        assert (
            not answer.safe and answer.snapshot.primaries[0].address != f"127.0.0.1:{victim.port}"
        )
        assert [(c.replica, c.eligible) for c in dead.candidates] == [(shard.write.name, False)], (
            dead
        )
        # (A loaded host can make the cluster fail another shard over too: that one is
        # recorded under its own name.)
        (event,) = [e for e in history.failover_events(store) if e["source"] == shard.name]
        assert event["source"] == shard.name and event["kind"] == "cluster"
        assert event["old_primary"] == f"127.0.0.1:{victim.port}"
        assert event["new_primary"] != event["old_primary"]
        assert event["bytes_lost"] is not None, event  # its last offset is on record
        reports = []

        async def all_measured() -> bool:
            reports.append(await run_probe_all(config, store=store, **PROBE))
            return all(p.seen == p.sent for p in reports[-1].pairs if p.source in others)

        await until(all_measured, "the other shards measured in full again", timeout_s=60)
        again = reports[-1]
    # The store remembers where the primary is now: no second event for the shard.
    assert all(e.source != shard.name for r in reports for e in r.failovers)
    # The dead old primary is one of the shard's servers: reported, not forgotten.
    assert f"127.0.0.1:{victim.port}" in {u["replica"] for u in again.unreachable}, again.render()


async def test_serve_follows_a_killed_shard_primary_with_a_failover_event(
    cluster: RedisClusterNodes, tmp_path: Path, store_path: Path
) -> None:
    config = await cluster_config(
        cluster, tmp_path / "serve.toml", tmp_path / "serve.sqlite",
        REPLAG_PROBE_INTERVAL="300ms", REPLAG_COUNT="20", REPLAG_RATE="0",
        REPLAG_TIMEOUT="2s", REPLAG_CHECK_INTERVAL="1h", REPLAG_REPLICATION_INTERVAL="200ms",
    )  # fmt: skip
    shard = config.topology.regions[1]
    assert shard.write is not None
    victim = next(n for n in cluster.nodes if n.port == shard.write.port)
    app = create_app(config)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replag")
        )

        async def get(path: str) -> Any:
            response = await client.get(path)
            assert response.status_code == 200, response.text
            return response.json()

        async def runs() -> dict[str, int]:
            """Each shard's last successful probe (one whose replicas all died has no pairs)."""
            probes = (await get("/api/v1/health"))["probes"]
            return {name: p["last_success_ns"] or 0 for name, p in probes.items()}

        async def every_shard_probed() -> bool:
            return len(await runs()) == 3

        await until(every_shard_probed, "every shard probed once")
        assert victim.pid is not None
        killed_ns = time.time_ns()
        os.kill(victim.pid, signal.SIGKILL)
        victim.pid = None
        killed_at = await runs()
        readings: list[tuple[dict[str, Any], str]] = []
        watching = asyncio.create_task(_watch_replication(client, shard.name, readings))

        async def failover_recorded() -> bool:
            events = (await get("/api/v1/replication"))["failovers"]
            return any(e["source"] == shard.name and e["kind"] == "cluster" for e in events)

        await until(failover_recorded, "serve records the shard's failover", timeout_s=90)

        async def dead_primary_listed() -> bool:
            # The dead old primary stays one of the shard's servers, its link down: never
            # a shard without replicas while it is down.
            primaries = (await get("/api/v1/replication"))["primaries"]
            (now,) = [p for p in primaries if p["source"] == shard.name]
            rows = {r["replica"]: r for r in now["replicas"]}
            old = rows.get(shard.write.name) if now["primary"] != shard.write.name else None
            return old is not None and old["link_up"] is not True

        await until(dead_primary_listed, "the dead old primary listed, link down", timeout_s=30)

        async def dead_node_said_once() -> bool:
            # Once a probe round found it unreachable, health says so, and only so: never
            # also "reachable, not replicating" for the same server.
            problems = (await get("/api/v1/health"))["problems"]
            kinds: dict[str | None, set[str]] = {}
            for p in problems:
                kinds.setdefault(p.get("replica"), set()).add(p["kind"])
            assert not any({"unreachable", "not_replicating"} <= k for k in kinds.values()), (
                problems
            )
            return "unreachable" in kinds.get(shard.write.name, set())

        await until(dead_node_said_once, "health names the dead node unreachable", timeout_s=60)

        def followed_a_while() -> bool:
            after = [p for p, _ in readings if p["primary"] != shard.write.name]
            return len(after) >= 20  # ~1 s of readings (10 samples) after the follow

        await until(followed_a_while, "readings of the shard's new primary", timeout_s=30)
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        # Every reading from the kill on, the first sample after it onwards: the dead node
        # is there with its state, as the shard's primary that cannot be read (before the
        # failover is followed) or as one of its servers, its link down (after), never
        # dropped; and /metrics, scraped with it, says its link is down.
        seen = [(p, m) for p, m in readings if p["sampled_ns"] > killed_ns]
        assert len(seen) >= 5, readings
        phases = []
        for primary, metrics in seen:
            if primary["primary"] == shard.write.name:
                assert primary["error"] and primary["replicas"], primary  # never replicas: []
                phases.append("primary unread")
                continue
            rows = {r["replica"]: r for r in primary["replicas"]}
            old = rows.get(shard.write.name)
            assert old is not None and old["link_up"] is False, primary
            assert old["status"] in ("unreachable", "link-down"), old
            series = (
                f'replag_replication_link_up{{primary="{primary["primary"]}",region='
                f'"{shard.name}",replica="{shard.write.name}",source="{shard.name}"}} '
            )
            assert series + "0.0" in metrics, metrics
            phases.append("a server, link down")
        assert phases[-1] == "a server, link down", phases
        # The other shards went on being probed meanwhile (their rounds ran and ended).
        probes = (await get("/api/v1/health"))["probes"]
        for name, end in killed_at.items():
            if name != shard.name:
                assert probes[name]["last_attempt_ns"] > end
        metrics = (await client.get("/metrics")).text
        assert f'replag_replication_failovers_total{{source="{shard.name}"}} 1.0' in metrics


async def test_failover_check_right_after_a_cluster_failover(
    cluster: RedisClusterNodes, tmp_path: Path, store_path: Path
) -> None:
    """failover-check reads CLUSTER SHARDS: right after a CLUSTER FAILOVER it samples the
    promoted replica (the config still names the old primary), and the demoted old primary
    is one of its candidates, safe once it follows."""
    config = await cluster_config(cluster, tmp_path / "c.toml", store_path)
    shard = config.topology.regions[0]
    assert shard.write is not None
    old = next(n for n in cluster.nodes if n.port == shard.write.port)
    replica = next(n for n in cluster.nodes if n.port == shard.replicas[0].port)
    with replica.client() as client:
        cluster_command(client, "FAILOVER")

    def demoted() -> bool:
        with old.client() as client:
            return client.info("replication")["role"] == "slave"

    await until(lambda: asyncio.to_thread(demoted), "the old primary demoted", timeout_s=60)
    first = await failover_check(config, source=shard.name)
    (primary,) = first.snapshot.primaries
    assert primary.error is None and primary.address == f"127.0.0.1:{replica.port}"
    notes = first.snapshot.notes
    assert any(f"the primary is 127.0.0.1:{replica.port} now (CLUSTER SHARDS" in n for n in notes)
    (assessment,) = first.assessments
    assert [c.replica for c in assessment.candidates] == [shard.write.name]

    async def safe() -> bool:
        return (await failover_check(config, source=shard.name)).safe

    await until(safe, "the demoted primary follows and is a safe candidate", timeout_s=60)


async def _watch_replication(
    client: httpx.AsyncClient, source: str, into: list[tuple[dict[str, Any], str]]
) -> None:
    """Until cancelled: `source`'s entry of /api/v1/replication and /metrics, read together
    every 50 ms."""
    while True:
        status = (await client.get("/api/v1/replication")).json()
        metrics = (await client.get("/metrics")).text
        (primary,) = [p for p in status["primaries"] if p["source"] == source]
        into.append((primary, metrics))
        await asyncio.sleep(0.05)
