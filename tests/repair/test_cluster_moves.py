"""Slot moves on today's servers (Valkey 9, Redis 8), checked on a real cluster.

Reshards run by `redis-cli --cluster reshard` during checks must give no stray key
and no stale mark (nothing is wrong with the cluster); strays a promoted replica
inherited are named as such, with advice that cannot bring deleted keys back; with
the check recipe's user a real stray is found, and a cluster read refused makes the
run not verified (exit 3). `benchmarks/cluster_reshard.py` runs the reshards 20
times under load.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import redis
import tomli_w
from click.testing import CliRunner, Result

from replag.cli import main
from replag.config import Config, load_config
from replag.discovery.cluster import discover_cluster
from replag.repair import check, repair
from replag.repair.keyspace.progress import RepairProgress
from replag.repair.keyspace.slots import key_slot, ranges
from replag.schemas import schema, versioned
from replag.service import ReplagService
from replag.store import Store
from replag.wire.permissions import SERVERS, acl_line
from tests.helpers.redis_cluster import RedisClusterNodes, start_cluster, wait_cluster_whole
from tests.helpers.reshard import (
    UNREPLICATED,
    cluster_config,
    load_keys,
    move_slot,
    primary_of,
    reshard,
    server_binary,
    tag_in,
    take_over,
)
from tests.helpers.server_kinds import using_server_kind
from tests.helpers.waiting import wait_until

KINDS = ("valkey-9", "redis-8")
USER, PASSWORD = "cluster-checker", "pw-cluster-checker"


@pytest.fixture(scope="module", params=KINDS)
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisClusterNodes]:
    binary = server_binary(request.param)
    if binary is None:
        pytest.skip(f"server kind {request.param}: no binary")
    # Valkey 9: keys in more databases than 0 (cluster-databases), for discovery to cover.
    more = ("--cluster-databases", "4") if request.param == "valkey-9" else ()
    with using_server_kind(binary):
        nodes = start_cluster(tmp_path_factory.mktemp(f"moves-{request.param}"), extra_args=more)
    try:
        load_keys(nodes, 3000)
        yield nodes
    finally:
        nodes.stop()


def _is_valkey(cluster: RedisClusterNodes) -> bool:
    with cluster.primaries[0].client() as c:
        return "valkey_version" in c.info("server")


def _served_slot(cluster: RedisClusterNodes, index: int, nth: int) -> int:
    """A slot primary `index` serves now (the `nth` hash tag's found there)."""
    port = cluster.primaries[index].port
    with cluster.primaries[0].client() as c:
        ranges = [(a, b) for a, b, p, *_ in c.execute_command("CLUSTER", "SLOTS") if p[1] == port]
    for first, last in ranges:
        return key_slot(tag_in(first, last, nth).encode())
    raise AssertionError(f"primary {port} serves no slot")


async def test_reshards_during_checks_give_no_false_strays_nor_stale_marks(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    """A check slowed to last through most of a reshard, three times, each between other
    shards: every slot that moved is named not compared, and nothing else is reported."""
    config = await cluster_config(cluster, tmp_path, "scan_rate = 3000\n")
    for source, dest in ((0, 1), (1, 2), (2, 0)):
        moving = asyncio.create_task(asyncio.to_thread(reshard, cluster, source, dest, 120))
        report = (await check(config)).to_dict()
        done = await moving
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        for group in report["groups"]:
            assert group["stray_keys"] == [], group
            assert group["stale_marks"] == [], group
            assert group["refused"] == [] and group["topology_changed"] is None, group
        assert report["divergent"] == 0 and not report["not_verified"], report


async def test_strays_a_promoted_replica_inherited_are_named_and_never_moved(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    """A replica's key its primary deleted, left by a slot move on the replica, which is
    then promoted: a stray on the primary, inherited, and the advice deletes it where it
    is (moving it would bring a deleted key back on the slot's owner). Valkey 9 drops a
    promoted replica's keys in slots it does not serve itself: nothing is left."""
    config = await cluster_config(cluster, tmp_path)
    old, heir = cluster.primaries[1], cluster.replicas[1]
    slot = _served_slot(cluster, 1, nth=7)
    key = f"inherit:{{{tag_in(slot, slot)}}}:deleted"
    with old.client() as source, cluster.primaries[2].client() as dest:
        source.set(key, "deleted on the primary")
        source.execute_command("WAIT", 1, 5000)
        source.eval(UNREPLICATED, 1, key, "")
        await asyncio.to_thread(move_slot, cluster, slot, source, dest)
    await asyncio.to_thread(take_over, heir)
    try:
        report = await check(config)
        rows = [r for g in report.groups for r in g.stray_keys]
        if _is_valkey(cluster) and not rows:
            return
        assert [(r["member"], r["keys"], r["on_primary"], r["origin"]) for r in rows] == [
            (f"127.0.0.1:{heir.port}", 1, True, "promoted")
        ], rows
        text = report.render()
        assert f"inherited: 127.0.0.1:{heir.port} held them as a replica" in text, text
        assert f"`redis-cli --cluster fix 127.0.0.1:{heir.port}`" not in text, text
        assert report.not_clean
    finally:
        await asyncio.to_thread(take_over, old)
        await asyncio.to_thread(wait_cluster_whole, cluster)
        with cluster.primaries[2].client() as dest, old.client() as home:
            await asyncio.to_thread(move_slot, cluster, slot, dest, home)
    await repair(config)  # the key is the replica's extra again: deleted through the primary
    after = await check(config)
    assert after.divergent == 0 and not after.not_clean, after.to_dict()


def _users(cluster: RedisClusterNodes, *rules: str) -> None:
    for node in cluster.nodes:
        with node.client() as c:
            c.execute_command("ACL", "SETUSER", *rules)


async def _service_outcome(config: Config, tmp_path: Path) -> str:
    """The outcome `serve` counts for a check of every group (replag_repair_runs_total)."""
    store = Store(tmp_path / "svc.sqlite")
    service = ReplagService(config, store=store)
    try:
        job = await service.wait_job(service.start_job("check", None).id)
        assert job.state == "done", job.to_dict()
        text = service.metrics.render().decode()
    finally:
        await service.stop()
        store.close()
    (line,) = [x for x in text.splitlines() if x.startswith("replag_repair_runs_total{")]
    return line.split('outcome="', 1)[1].split('"', 1)[0]


async def _cli(args: list[str], env: dict[str, str] | None = None) -> Result:
    """The CLI in a thread of its own (it runs an event loop)."""
    return await asyncio.to_thread(CliRunner().invoke, main, args, env=env)


def _recipe_config(cluster: RedisClusterNodes, tmp_path: Path, found: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(
        found + "\n" + tomli_w.dumps({"settings": {
            "username": USER, "password_env": "CLUSTER_CHECKER_PW", "repair_settle": "100ms",
            "store": str(tmp_path / "s.sqlite")}})
    )  # fmt: skip
    return path


async def test_the_check_recipe_finds_a_stray_and_a_refused_read_is_not_verified(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    kind = "valkey-9" if _is_valkey(cluster) else "redis-8"
    line = acl_line("check", USER, prefix="replag:probe:", features=SERVERS[kind])
    _users(cluster, USER, "reset", "on", f">{PASSWORD}", *line.split()[3:])
    found = (await discover_cluster(cluster.url, timeout_s=5)).render()
    path = _recipe_config(cluster, tmp_path, found)
    env = {"CLUSTER_CHECKER_PW": PASSWORD}
    slot = _served_slot(cluster, 0, nth=9)
    key = f"recipe:{{{tag_in(slot, slot)}}}:left"
    source, dest = primary_of(cluster, key), cluster.primaries[2].client()
    with source, dest:
        source.set(key, "only the replica keeps it")
        source.execute_command("WAIT", 1, 5000)
        source.eval(UNREPLICATED, 1, key, "")
        await asyncio.to_thread(move_slot, cluster, slot, source, dest)
        try:
            report = await check(load_config(path, environ=env))
            rows = [(r["keys"], r["origin"]) for g in report.groups for r in g.stray_keys]
            assert rows == [(1, "replica")], report.to_dict()
            assert not report.not_verified, report.to_dict()
            acl_check = ["acl", "--mode", "check", "--user", USER, "-c", str(path), "--check"]
            checked = await _cli(acl_check, env)
            assert checked.exit_code == 0, checked.output
            # The recipe of before (no cluster reads): `acl --check` names what it lacks.
            _users(cluster, USER, "-cluster|nodes", "-cluster|countkeysinslot")
            lacking = await _cli(acl_check, env)
            assert lacking.exit_code == 1, lacking.output
            assert "CLUSTER|NODES, CLUSTER|COUNTKEYSINSLOT" in lacking.stderr, lacking.stderr
            # A user no pre-run check tries (the default one) refused a cluster read: the
            # stray is not seen, and the run says so: not verified, exit 3, never clean.
            _users(cluster, "default", "-cluster|countkeysinslot")
            try:
                plain = tmp_path / "plain.toml"
                plain.write_text(found + f'\n[settings]\nstore = "{tmp_path}/p.sqlite"\n')
                refused = await _cli(["repair", "check", "-c", str(plain)])
                served = await _service_outcome(load_config(plain), tmp_path)
            finally:
                _users(cluster, "default", "+cluster|countkeysinslot")
            assert refused.exit_code == 3, refused.output
            assert "permission refused: CLUSTER|COUNTKEYSINSLOT (user default)" in refused.output
            assert "NOT VERIFIED" in refused.output
            assert served == "not_verified"  # serve never records it as clean either
        finally:
            await asyncio.to_thread(move_slot, cluster, slot, dest, source)
            _users(cluster, USER, "off")
    await repair(await cluster_config(cluster, tmp_path))


async def test_slot_counts_name_the_slots_a_replica_missed_and_serve_exports_them(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    """CLUSTER SLOT-STATS, primary against replica: keys the replica missed in three
    slots and one it holds alone in a fourth are named by slot, exactly (a quiet
    cluster: one replication offset); a slot where it misses one key and holds
    another counts the same and is not named (the check finds both keys); the
    service's gauges carry the totals per replica."""
    config = await cluster_config(cluster, tmp_path)
    slots = [_served_slot(cluster, 0, nth=40 + i) for i in range(5)]
    keys = [f"sc:{{{tag_in(s, s)}}}" for s in slots]
    missing = [keys[0] + ":a", keys[0] + ":b", keys[1] + ":a", keys[2] + ":a"]
    extra, swapped = keys[3] + ":alone", [keys[4] + ":gone", keys[4] + ":kept"]
    source = primary_of(cluster, keys[0])
    with source:
        for key in (extra, swapped[1]):
            source.set(key, "the replica keeps it")
        source.execute_command("WAIT", 1, 5000)
        for key in (*missing, swapped[0]):
            source.eval(UNREPLICATED, 1, key, "only on the primary")
        for key in (extra, swapped[1]):
            source.eval(UNREPLICATED, 1, key, "")
        replica_name = f"127.0.0.1:{cluster.replicas[0].port}"
    report = await check(config)
    body = report.to_dict()
    assert {k["key"] for k in body["divergent_keys"]} == {*missing, extra, *swapped}, body
    jsonschema.validate(json.loads(json.dumps(versioned(body))), schema("check"))
    rows = {r["member"]: r for g in report.groups for r in g.slot_counts}
    assert len(rows) == len(cluster.replicas), rows  # every replica compared, none skipped
    (differing,) = [r for r in rows.values() if r["slots_differing"]]
    assert replica_name in differing["member"], differing
    assert differing["slots"] == [list(r) for r in ranges(slots[:4])], differing
    assert (differing["key_difference"], differing["replica_minus_primary"]) == (5, -3)
    assert differing["exact"] and differing["unconfirmed"] == 0, differing
    assert {(e["slot"], e["primary"], e["replica"]) for e in differing["examples"]} == {
        (slots[0], 2, 0), (slots[1], 1, 0), (slots[2], 1, 0), (slots[3], 0, 1)
    }  # fmt: skip
    assert all(g.slot_counts_missing is None for g in report.groups)
    text = report.render()
    (line,) = [x for x in text.splitlines() if "slot counts:" in x]
    assert "in 4 slots, 5 keys (-3 on the replica; at one replication offset)" in line, line
    store = Store(tmp_path / "svc.sqlite")
    service = ReplagService(config, store=store)
    try:
        job = await service.wait_job(service.start_job("check", None).id)
        assert job.state == "done", job.to_dict()
        metrics = service.metrics.render().decode()
    finally:
        await service.stop()
        store.close()
    gauges = [x for x in metrics.splitlines() if x.startswith("replag_slot_count_")]
    assert len(gauges) == 2 * len(cluster.replicas), gauges  # per replica, never per slot
    mine = sorted(x.split("} ")[1] for x in gauges if differing["member"] in x)
    assert mine == ["4.0", "5.0"], gauges
    fixed = (await repair(config)).to_dict()
    assert fixed["repaired"] == 7 and fixed["errors"] == 0, fixed


async def test_every_database_holding_keys_is_discovered_and_checked_on_valkey_9(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    """Valkey 9's cluster-databases: keys in db 1 of a shard give a group of their own at
    discovery, checked through the same nodes; a database filled after discovery is
    named not checked, with a hint that discovering again covers it."""
    if not _is_valkey(cluster):
        pytest.skip("cluster-databases is Valkey 9's")
    slot = _served_slot(cluster, 0, nth=11)
    keys = [f"db1:{{{tag_in(slot, slot)}}}:{i}" for i in range(20)]
    port = primary_of(cluster, keys[0]).connection_pool.connection_kwargs["port"]
    with redis.Redis(port=port, db=1) as db1, redis.Redis(port=port, db=2) as db2:
        try:
            for key in keys:
                db1.set(key, "v")
            db1.execute_command("WAIT", 1, 5000)
            db1.eval(UNREPLICATED, 1, keys[3], "only on the primary")
            config = await cluster_config(cluster, tmp_path)
            (group,) = [g for g in config.topology.groups if g.name.endswith("-db1")]
            assert {m.db for m in group.members} == {1} and len(group.members) == 2
            report = await check(config)
            found = {(k["group"], k["key"]) for k in report.to_dict()["divergent_keys"]}
            assert found == {(group.name, keys[3])} and not report.not_clean, report.to_dict()
            db2.set(keys[0], "after discovery")
            later = await check(config)
            unchecked = {(u["db"], u["keys"], u["cluster"]) for u in later.unchecked_databases}
            assert unchecked == {(2, 1, True)}, later.unchecked_databases
            assert "`replag topology discover --cluster URL --out FILE`" in later.render()
        finally:
            db1.delete(*keys)
            db2.delete(keys[0])


async def test_a_shard_a_slot_migration_empties_is_a_topology_change(tmp_path: Path) -> None:
    """Valkey 9: CLUSTER MIGRATESLOTS of every slot of a shard while it is checked. The
    migration is named by its range; once Valkey has made the emptied primary a replica
    of the slots' new owner, its group is "topology changed: rediscover", not keys to
    resync, and the run is not verified."""
    binary = server_binary("valkey-9")
    if binary is None:
        pytest.skip("no Valkey 9")
    with using_server_kind(binary):
        pair = start_cluster(tmp_path / "pair", primaries=2)
    try:
        load_keys(pair, 2000)
        config = await cluster_config(pair, tmp_path, "scan_rate = 2000\n")
        (first, last), emptied = pair.slots[1], pair.primaries[1]
        with pair.primaries[0].client() as c:
            owner = c.execute_command("CLUSTER", "MYID").decode()
        started: list[RepairProgress] = []
        (receiving,) = [
            g.name
            for g in config.topology.groups
            if any(m.port == pair.primaries[0].port for m in g.members)
        ]

        def migrate_once_scanning(progress: RepairProgress) -> None:
            # The receiving shard's scan under way (its first slot map read): every slot
            # of the other shard moves to it. (The emptied shard's primary, a replica
            # once it is done, lists no migration any more.)
            scanning = progress.phase == "scan" and progress.done > 0
            if not started and scanning and progress.group == receiving:
                started.append(progress)
                with emptied.client() as c:
                    c.execute_command(
                        "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", first, last, "NODE", owner
                    )

        during = (await check(config, progress=migrate_once_scanning)).to_dict()
        assert started, "the check reported no progress"
        moved = [m for g in during["groups"] for m in g["slot_migrations"]]
        seen = [(g["group"], g["slot_migrations"], g["slots_not_compared"], g["topology_changed"])
                for g in during["groups"]]  # fmt: skip
        assert [first, last] in [r for m in moved for r in m["slots"]], (seen, started)
        assert all(g["stray_keys"] == [] for g in during["groups"]), during

        def replica_now() -> bool:
            with emptied.client() as c:
                return bool(c.info("replication")["role"] == "slave")

        await asyncio.to_thread(wait_until, replica_now, "the emptied primary a replica")
        report = await check(config)
        (changed,) = [g for g in report.groups if g.topology_changed]
        assert f"now replicates 127.0.0.1:{pair.primaries[0].port}" in str(changed.topology_changed)
        assert report.not_verified and not any(g.stray_keys for g in report.groups)
        text = report.render()
        assert "topology changed" in text and "rediscover" in text, text
        assert "full resync" not in text, text
    finally:
        pair.stop()
