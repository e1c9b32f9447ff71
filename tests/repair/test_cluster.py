"""Repair on a real Redis Cluster (3 primaries, 3 replicas), per server kind.

Divergence is made on each shard's primary with replication switched off for
those writes (`redis.set_repl(redis.REPL_NONE)` in a script): a key the replica
misses, one it holds alone, one it holds with another value. The check must
find exactly those (CROSSSLOT-free scans, READONLY on replicas), the repair
must fix them through each shard's primary, and a slot migrating, a reshard
or a `CLUSTER FAILOVER` during a check must give exact results or a named list
of slots not compared: never a false positive.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis

from replag.config import Config
from replag.repair import check, repair
from replag.repair.keyspace.slots import key_slot
from replag.schemas import schema, versioned
from tests.helpers.redis_cluster import (
    RedisClusterNodes,
    cluster_command,
    start_cluster,
    wait_cluster_ok,
    wait_cluster_whole,
)
from tests.helpers.reshard import (
    UNREPLICATED,
)
from tests.helpers.reshard import (
    cluster_config as _config,
)
from tests.helpers.reshard import (
    is_primary as _is_primary,
)
from tests.helpers.reshard import (
    move_slot as _move_slot,
)
from tests.helpers.reshard import (
    primary_of as _primary_of,
)
from tests.helpers.reshard import (
    tag_in as _tag,
)
from tests.helpers.reshard import (
    take_over as _take_over,
)
from tests.helpers.server_kinds import KINDS, kind_binary, using_server_kind
from tests.helpers.waiting import until, wait_until


@pytest.fixture(scope="module", params=KINDS)
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisClusterNodes]:
    """One cluster per server kind for the whole module (the tests leave it consistent)."""
    binary, missing = kind_binary(request.param)
    if binary is None:
        pytest.skip(f"server kind {request.param}: {missing}")
    with using_server_kind(binary):
        nodes = start_cluster(tmp_path_factory.mktemp(f"cluster-{request.param}"))
    try:
        yield nodes
    finally:
        nodes.stop()


def _settled(cluster: RedisClusterNodes) -> None:
    """Every primary's writes so far have reached its replicas."""
    for node in cluster.nodes:
        with node.client() as c:
            if c.info("replication")["role"] == "master":
                c.execute_command("WAIT", 1, 5000)


def _diverge(cluster: RedisClusterNodes, prefix: str) -> set[str]:
    """Per shard: a key its replica lacks, one only its replica has, one it holds with
    another value, plus 50 keys alike. The divergent keys."""
    planted: set[str] = set()
    for first, last in cluster.slots:
        tag = "{" + _tag(first, last) + "}"
        client = _primary_of(cluster, tag)
        with client:
            for i in range(50):
                client.set(f"{prefix}{tag}:same{i}", i)
            client.set(f"{prefix}{tag}:extra", "replica keeps it")
            client.set(f"{prefix}{tag}:value", "old")
            client.execute_command("WAIT", 1, 5000)
            client.eval(UNREPLICATED, 1, f"{prefix}{tag}:missing", "only on the primary")
            client.eval(UNREPLICATED, 1, f"{prefix}{tag}:extra", "")
            client.eval(UNREPLICATED, 1, f"{prefix}{tag}:value", "new")
        planted |= {f"{prefix}{tag}:{name}" for name in ("missing", "extra", "value")}
    return planted


def _found(report: dict[str, Any]) -> set[str]:
    return {k["key"] for k in report["divergent_keys"]}


def _named(report: dict[str, Any]) -> set[int]:
    return {
        s for g in report["groups"] for a, b in g["slots_not_compared"] for s in range(a, b + 1)
    }


async def test_divergence_on_every_shard_is_found_exactly_and_fixed_through_the_primary(
    cluster: RedisClusterNodes, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    config = await _config(cluster, tmp_path)
    planted = await asyncio.to_thread(_diverge, cluster, "a:")
    report = await check(config)
    found = report.to_dict()
    assert _found(found) == planted, found
    text = report.render()
    for group in found["groups"]:
        assert group["kind"] == "replication" and group["slots_not_compared"] == []
        replica = [n for n in group["per_replica"] if n != group["primary"]]
        counts = group["per_replica"][replica[0]]
        assert (counts["missing"], counts["extra"], counts["different"]) == (1, 1, 1)
        # One vocabulary: the summary's row says what the per-replica table says (a key
        # only the replica holds is extra there, never counted as missing).
        assert group["found"] == {"missing": 1, "extra": 1, "different": 1}, group
        row = next(line for line in text.splitlines() if line.startswith(group["group"] + " "))
        assert row.split()[1:4] == ["1", "1", "1"], row
    # Each shard's replica misses one key and holds another in the same slot: its key
    # counts equal its primary's (CLUSTER SLOT-STATS names no slot), the check finds
    # both. A server without the command skips it, said once for every group.
    supported = request.node.callspec.params["cluster"] == "valkey-9"
    rows = [r for g in report.groups for r in g.slot_counts]
    assert [r["slots_differing"] for r in rows] == ([0] * 3 if supported else []), rows
    said = [x for x in text.splitlines() if x.startswith("slot counts not compared")]
    assert len(said) == (0 if supported else 1), text
    if not supported:
        assert "in 3 groups: the server has no CLUSTER SLOT-STATS" in said[0], said
    fixed = (await repair(config)).to_dict()
    assert fixed["repaired"] == 9 and fixed["errors"] == 0, fixed
    for group, stats in ((g, g["replicas"]) for g in fixed["groups"]):
        assert [r["writes"] for r in stats if r["replica"] != group["primary"]] == [0]
    assert (await check(config)).divergent == 0
    for replica in cluster.replicas:
        with replica.client() as c:
            c.execute_command("READONLY")
            keys = {k.decode() for k in c.scan_iter(match="a:*")}
            assert not any(k.endswith(":extra") for k in keys)


async def test_a_migrating_slot_and_a_reshard_are_named_never_reported(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    config = await _config(cluster, tmp_path)
    (first, last), target = cluster.slots[0], cluster.primaries[1]
    moving_tag = _tag(first, last, nth=1)
    slot = key_slot(moving_tag.encode())
    source = _primary_of(cluster, "{" + moving_tag + "}")
    keys = [f"m:{{{moving_tag}}}:{i}" for i in range(20)]
    planted = await asyncio.to_thread(_diverge_avoiding, cluster, "b:", slot)
    with source, target.client() as dest:
        for key in keys:
            source.set(key, "v")
        source.execute_command("WAIT", 1, 5000)
        ids = {"source": source.execute_command("CLUSTER", "MYID").decode(),
               "dest": dest.execute_command("CLUSTER", "MYID").decode()}  # fmt: skip
        dest.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids["source"])
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids["dest"])
        source.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000,
                               "KEYS", *keys[:10])  # fmt: skip
        # Half the slot's keys moved, and none moves while it is checked: a stuck move,
        # named as such with both ends and the keys each holds, and its slot compared.
        half = (await check(config)).to_dict()
        assert _found(half) == planted, half
        assert slot not in _named(half), half
        rows = [m for g in half["groups"] for m in g["stuck_moves"]]
        assert {
            (m["migrating"], m["importing"], m["keys_migrating"], m["keys_importing"]) for m in rows
        } == {(_address(source), f"127.0.0.1:{target.port}", 10, 10)}
        assert all(m["slots"] == [[slot, slot]] for m in rows), rows
        source.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000,
                               "KEYS", *keys[10:])  # fmt: skip
        for node in cluster.nodes:
            with node.client() as c:
                if c.info("replication")["role"] == "master":
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids["dest"])

    # A real reshard running through a check: whatever the interleaving, every key
    # reported was planted, and a planted key not reported is in a slot that moved.
    def reshard() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/usr/bin/redis-cli", "--cluster", "reshard", f"127.0.0.1:{target.port}",
             "--cluster-from", ids["source"], "--cluster-to", ids["dest"],
             "--cluster-slots", "300", "--cluster-yes", "--cluster-pipeline", "5"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    moving = asyncio.create_task(asyncio.to_thread(reshard))
    during = (await check(config)).to_dict()
    done = await moving
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _found(during) <= planted, during
    moved = _moved_slots(cluster, ids["dest"], first, last)
    for key in planted - _found(during):
        assert key_slot(key.encode()) in _named(during) | moved, (key, during)
    await asyncio.to_thread(_settled, cluster)
    after = (await check(config)).to_dict()
    assert _found(after) <= planted and _named(after) == set(), after
    await repair(config)
    assert (await check(config)).divergent == 0


async def test_keys_a_reshard_leaves_on_a_replica_are_named_with_who_serves_their_slot(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    config = await _config(cluster, tmp_path)
    first, last = cluster.slots[0]
    tag = _tag(first, last, nth=2)
    slot, key = key_slot(tag.encode()), f"s:{{{tag}}}:left"
    source = _primary_of(cluster, key)
    dest = _primary_of(cluster, "{" + _tag(*cluster.slots[2]) + "}")
    src_port = source.connection_pool.connection_kwargs["port"]
    dest_port = dest.connection_pool.connection_kwargs["port"]
    assert src_port != dest_port
    with source, dest:
        source.set(key, "only the replica keeps it")
        source.execute_command("WAIT", 1, 5000)
        source.eval(UNREPLICATED, 1, key, "")  # the replica holds it, the primary does not
        await asyncio.to_thread(_move_slot, cluster, slot, source, dest)
        try:
            report = await check(config)
            shard = next(
                g
                for g in report.groups
                if any(m.port == src_port for m in _members(config, g.group))
            )
            (row,) = shard.stray_keys
            (replica,) = [m.name for m in _members(config, shard.group) if m.port != src_port]
            serving = next(
                g.group
                for g in report.groups
                if any(m.port == dest_port for m in _members(config, g.group))
            )
            assert (row["member"], row["keys"], row["slots"]) == (replica, 1, [[slot, slot]])
            assert (row["served_by"], row["served_at"]) == (serving, f"127.0.0.1:{dest_port}")
            assert row["examples"] == [{"key": key}] and report.not_clean
            text = report.render()
            assert f"{replica} holds 1 key in slots this shard does not serve: {slot}" in text
            assert f"a full resync of {replica} removes them" in text and "NOT CLEAN" in text
            # Valkey replicates SETSLOT MIGRATING to the replica, and the move ended with
            # SETSLOT NODE on the primaries: the replica's mark stays, with no move under
            # way. Named as stale, and the slot is not "moved during the run".
            assert shard.slots_not_compared == []
            if _replica_marked(cluster, slot):  # Valkey 9 (Redis 7 keeps marks on primaries)
                assert shard.stale_marks == [
                    {"node": f"127.0.0.1:{_marked_port(cluster, slot)}", "slots": [[slot, slot]]}
                ]
                assert f"stale slot mark on 127.0.0.1:{_marked_port(cluster, slot)}" in text
        finally:
            # The slot back home: the key is the replica's extra again, and is repaired.
            await asyncio.to_thread(_move_slot, cluster, slot, dest, source)
    await repair(config)
    after = await check(config)
    assert after.divergent == 0 and not after.not_clean, after.to_dict()


async def test_a_mark_without_its_other_end_is_named_stale_and_its_slot_compared(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    """A slot marked migrating on its primary while the node it names imports nothing (a
    move abandoned half-way, or whose other end was reset): no move is under way, so the
    slot is compared, and the mark is named with where to clear it. With both ends
    marked it is a move, not compared."""
    config = await _config(cluster, tmp_path)
    first, last = cluster.slots[0]
    tag = _tag(first, last, nth=3)
    slot = key_slot(tag.encode())
    source = _primary_of(cluster, "{" + tag + "}")
    dest = _primary_of(cluster, "{" + _tag(*cluster.slots[2]) + "}")
    src_port = source.connection_pool.connection_kwargs["port"]
    with source, dest:
        src_id = source.execute_command("CLUSTER", "MYID").decode()
        dest_id = dest.execute_command("CLUSTER", "MYID").decode()
        try:
            source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dest_id)
            half = await check(config)
            assert slot not in _named(half.to_dict()), half.to_dict()
            (shard,) = [g for g in half.groups
                        if any(m.port == src_port for m in _members(config, g.group))]  # fmt: skip
            marks = {(m["node"], s) for m in shard.stale_marks for a, b in m["slots"]
                     for s in range(a, b + 1)}  # fmt: skip
            assert (f"127.0.0.1:{src_port}", slot) in marks, shard.stale_marks
            assert f"stale slot mark on 127.0.0.1:{src_port}: {slot}" in half.render()
            dest.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            # Both ends marked, no key in the slot: a move, stuck while it was checked.
            both = await check(config)
            assert slot not in _named(both.to_dict()), both.to_dict()
            left = [m for g in both.groups for m in g.stale_marks
                    if any(a <= slot <= b for a, b in m["slots"])]  # fmt: skip
            assert left == [], left
            (stuck,) = {(m["migrating"], m["importing"], m["keys_importing"])
                        for g in both.groups for m in g.stuck_moves}  # fmt: skip
            assert stuck == (f"127.0.0.1:{src_port}", _address(dest), 0), stuck
            assert f"`CLUSTER SETSLOT {slot} STABLE` (each slot) on 127.0.0.1:{src_port}" in (
                both.render()
            )
        finally:
            dest.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
            source.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")


def _address(client: redis.Redis) -> str:
    return f"127.0.0.1:{client.connection_pool.connection_kwargs['port']}"


def _myid(client: redis.Redis) -> str:
    return str(client.execute_command("CLUSTER", "MYID").decode())


def _finish_move(cluster: RedisClusterNodes, slot: int, dest: redis.Redis) -> None:
    """Whatever marks are left: the slot's keys moved from whichever primary serves it now
    to `dest`, and `dest` serves it."""
    with _primary_of(cluster, _key_in(slot)) as source:
        _move_slot(cluster, slot, source, dest)


def _drop_move(slot: int, dest: redis.Redis, source: redis.Redis) -> None:
    """An interrupted move undone by dropping the slot's keys at both ends, both marks
    cleared. The importing end's keys go with FLUSHALL (its shard is the test's): Redis 7
    forgets who serves a slot it imports from a primary turned replica, and then refuses
    every command on its keys, ASKING or not."""
    dest.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
    source.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
    while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        source.delete(*keys)
    dest.flushall()
    dest.execute_command("WAIT", 1, 5000)


def _key_in(slot: int) -> str:
    return "{" + _tag(slot, slot) + "}"


async def test_a_live_move_is_named_moving_while_its_keys_are_migrated(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    """Both ends marked and keys leaving the migrating node while the check runs: a live
    move, its slot not compared, and never called stuck."""
    config = await _config(cluster, tmp_path)
    slot = key_slot(_tag(*cluster.slots[0], nth=4).encode())
    source = _primary_of(cluster, _key_in(slot))
    dest = _primary_of(cluster, "{" + _tag(*cluster.slots[2]) + "}")
    keys = [f"live:{_key_in(slot)}:{i}" for i in range(3000)]
    stop = threading.Event()

    def migrate() -> None:
        port = dest.connection_pool.connection_kwargs["port"]
        with redis.Redis(port=source.connection_pool.connection_kwargs["port"]) as mover:
            for key in keys:
                if stop.is_set():
                    return
                mover.execute_command("MIGRATE", "127.0.0.1", port, key, 0, 5000)
                time.sleep(0.001)

    with source, dest:
        with source.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.set(key, "v")
            pipe.execute()
        source.execute_command("WAIT", 1, 5000)
        dest.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _myid(source))
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _myid(dest))
        mover = threading.Thread(target=migrate)
        mover.start()
        try:
            wait_until(
                lambda: source.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) < len(keys),
                "the first key migrated",
            )
            report = await check(config)
        finally:
            stop.set()
            mover.join()
            await asyncio.to_thread(_finish_move, cluster, slot, dest)
            await asyncio.to_thread(_move_slot, cluster, slot, dest, source)
            source.delete(*keys)
        assert slot in _named(report.to_dict()), report.to_dict()
        assert not any(g.stuck_moves for g in report.groups), report.to_dict()
        assert "a live move during the run" in report.render()


async def test_a_move_a_failover_interrupted_is_stuck_or_stale_and_its_slot_compared(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    """Half a slot's keys moved, then its shard's replica takes over (the issue's
    reshard interrupted by a failover). Valkey hands both marks on to the new primaries,
    so the move is marked on both ends for ever with nothing moving: named stuck, not
    live. Redis keeps marks on the primary that set them: the importing end's mark is
    left naming a replica, stale. Either way the slot is compared (a key the new primary's
    replica lacks there is found) and never named as moving."""
    config = await _config(cluster, tmp_path)
    slot = key_slot(_tag(*cluster.slots[0], nth=5).encode())
    old, heir = cluster.primaries[0], cluster.replicas[0]
    dest = _primary_of(cluster, "{" + _tag(*cluster.slots[2]) + "}")
    keys = [f"f:{_key_in(slot)}:{i}" for i in range(20)]
    with old.client() as source, dest:
        assert source.info("replication")["role"] == "master"
        for key in keys:
            source.set(key, "v")
        source.execute_command("WAIT", 1, 5000)
        dest.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _myid(source))
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _myid(dest))
        port = dest.connection_pool.connection_kwargs["port"]
        source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys[:10])
        source.execute_command("WAIT", 1, 5000)
    try:
        with heir.client() as c:
            c.execute_command("CLUSTER", "FAILOVER")
        await until(lambda: asyncio.to_thread(_is_primary, heir), "the replica took over")
        await asyncio.to_thread(wait_cluster_ok, cluster)
        with heir.client() as new:
            new.execute_command("WAIT", 1, 5000)
            new.eval(UNREPLICATED, 1, keys[15], "only on the new primary")
        report = await check(config)
        body = report.to_dict()
        assert _found(body) == {keys[15]}, body
        document = json.loads(json.dumps(versioned(body)))  # as --json prints it
        jsonschema.validate(document, schema("check"))  # stuck_moves typed, nothing unknown
        assert slot not in _named(body), body
        stuck = [m for g in report.groups for m in g.stuck_moves]
        stale = {(m["node"], s) for g in report.groups for m in g.stale_marks
                 for a, b in m["slots"] for s in range(a, b + 1)}  # fmt: skip
        text = report.render()
        with heir.client() as c:
            valkey = "valkey_version" in c.info("server")
        if valkey:  # the marks went on to the heir, and the importing end follows it
            ends = {(m["migrating"], m["importing"], m["keys_migrating"], m["keys_importing"])
                    for m in stuck}  # fmt: skip
            assert ends == {(f"127.0.0.1:{heir.port}", _address(dest), 10, 10)}, body
            assert f"stuck slot move: {slot} marked migrating on 127.0.0.1:{heir.port}" in text
            assert f"redis-cli --cluster fix 127.0.0.1:{heir.port}" in text
        else:  # Redis: the importing end names the old primary, a replica now
            assert stuck == [] and (_address(dest), slot) in stale, body
            assert f"stale slot mark on {_address(dest)}: {slot}" in text
            # The 10 keys the move took across are on the importing primary: said so, with
            # the fix that moves them back (not "a full resync", which a primary never has).
            rows = [r for g in report.groups for r in g.stray_keys if r["member"] == _address(dest)]
            assert [(r["keys"], r["slots"], r["on_primary"]) for r in rows] == [
                (10, [[slot, slot]], True)
            ], rows
            assert f"`redis-cli --cluster fix {_address(dest)}`" in text
    finally:
        with dest, heir.client() as new:
            await asyncio.to_thread(_drop_move, slot, dest, new)
        await asyncio.to_thread(wait_cluster_ok, cluster)
        await asyncio.to_thread(_take_over, old)
        await asyncio.to_thread(wait_cluster_whole, cluster)


def _marked_port(cluster: RedisClusterNodes, slot: int) -> int | None:
    """The port of the replica whose own CLUSTER NODES line marks `slot` as moving."""
    for node in cluster.replicas:
        with node.client() as c:
            mine = next(
                x for x in cluster_command(c, "NODES").decode().splitlines() if "myself" in x
            )
        if f"[{slot}-" in mine and "slave" in mine.split()[2]:
            return node.port
    return None


def _replica_marked(cluster: RedisClusterNodes, slot: int) -> bool:
    return _marked_port(cluster, slot) is not None


def _members(config: Config, group: str) -> tuple[Any, ...]:
    return config.topology.group(group).members


async def test_a_failover_during_a_check_and_repair_through_the_new_primary(
    cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    config = await _config(cluster, tmp_path)
    planted = await asyncio.to_thread(_diverge, cluster, "c:")
    replica = cluster.replicas[2]
    with replica.client() as c:
        before = c.info("replication")["role"]

    async def failover() -> None:
        await asyncio.sleep(0.05)
        with replica.client() as c:
            c.execute_command("CLUSTER", "FAILOVER")

    during, _ = await asyncio.gather(check(config), failover())
    report = during.to_dict()
    assert _found(report) <= planted, report
    for key in planted - _found(report):
        assert key_slot(key.encode()) in _named(report), (key, report)

    def promoted() -> bool:
        with replica.client() as c:
            return bool(c.info("replication")["role"] == "master")

    await until(lambda: asyncio.to_thread(promoted), "the replica is the primary")
    assert before == "slave"
    fixed = (await repair(config)).to_dict()
    shard = next(g for g in fixed["groups"] if f"127.0.0.1:{replica.port}" in g["per_replica"])
    assert shard["primary"] == f"127.0.0.1:{replica.port}", shard
    assert fixed["errors"] == 0 and fixed["resync"] == 0, fixed
    assert (await check(config)).divergent == 0


def _diverge_avoiding(cluster: RedisClusterNodes, prefix: str, slot: int) -> set[str]:
    planted = _diverge(cluster, prefix)
    assert all(key_slot(k.encode()) != slot for k in planted)
    return planted


def _moved_slots(cluster: RedisClusterNodes, dest_id: str, first: int, last: int) -> set[int]:
    """Slots of [first, last] the node `dest_id` serves now."""
    with cluster.primaries[0].client() as c:
        lines = cluster_command(c, "NODES").decode().splitlines()
    owned: set[int] = set()
    for line in lines:
        parts = line.split()
        if parts[0] != dest_id:
            continue
        for item in parts[8:]:
            if not item.startswith("["):
                a, _, b = item.partition("-")
                owned |= set(range(int(a), int(b or a) + 1))
    return {s for s in owned if first <= s <= last}
