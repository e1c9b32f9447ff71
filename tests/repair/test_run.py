"""`repair run` against real replicas: policies, safety switches, the store, the CLI."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from replag.cli import main
from replag.config import render_config
from replag.errors import UsageError
from replag.lab.server import RedisServer
from replag.repair import RepairProgress, check, get_run, list_runs, repair
from replag.repair.keyspace.observe import KeyState, observe_keys
from replag.repair.keyspace.values import read_values
from replag.repair.writes.guarded_write import typed_writes
from replag.store import Store
from replag.wire.resp import RespConnection
from tests.helpers.configs import group_config
from tests.helpers.keyspace import FIELDS_EXPIRE_AT_MS, write_every_type
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.server_kinds import kind_binary, using_server_kind
from tests.helpers.waiting import until


def three(redis_factory: RedisFactory) -> tuple[list[RedisServer], list[redis.Redis]]:
    servers = [redis_factory("q") for _ in range(3)]
    return servers, [s.client() for s in servers]


def snapshot(client: redis.Redis) -> dict[bytes, tuple[bytes | None, int]]:
    return {k: (client.dump(k), client.pttl(k)) for k in client.scan_iter(count=1000)}


async def test_quorum_repairs_every_kind_and_carries_ttls(
    value_kind: str, tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers, (a, b, c) = three(redis_factory)
    for client in (a, b, c):
        client.set("same", "1")
        client.set("value", "good")
        client.set("type", "string")
        client.set("ttl", "t")
    a.set("missing", "here", px=300_000)
    b.set("missing", "here", px=300_000)
    c.set("value", "bad")
    c.delete("type")
    c.rpush("type", "a", "list")
    b.expire("ttl", 3600)
    c.set("extra", "only on c")
    config = group_config(tmp_path, servers)
    store = Store(tmp_path / "replag.sqlite")
    report = await repair(config, store=store)
    result = report.to_dict()
    assert result["counts"] == {"missing": 2, "value": 1, "type": 1, "ttl": 1}
    assert result["repaired"] == 5 and result["conflicts"] == 0
    assert c.get("value") == b"good" and c.type("type") == b"string"
    assert b.ttl("ttl") == -1  # the majority has no TTL
    assert a.get("extra") == b.get("extra") == b"only on c"  # copied, not deleted
    assert 290_000 < c.pttl("missing") <= 300_000  # TTL carried over
    assert (await check(config)).divergent == 0
    assert sum(r["writes"] for r in result["replicas"]) >= 5
    run = get_run(store, report.run_id)
    assert run is not None and run["status"] == "done" and run["report"]["repaired"] == 5
    assert list_runs(store)[0]["run_id"] == report.run_id
    json.dumps(list_runs(store))
    store.close()


async def test_every_type_is_copied_exactly(
    value_kind: str, tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers, (a, b, c) = three(redis_factory)
    write_every_type(a)
    write_every_type(b, reverse=True)
    expires_at = int(time.time() * 1000) + 600_000
    for client in (a, b):
        client.pexpireat(b"t:zset", expires_at)
    report = await repair(group_config(tmp_path, servers))
    assert report.to_dict()["repaired"] == 7
    # Judged by the servers themselves, not by replag's digests: c's copy of each key
    # serializes (DUMP) exactly as one of the two majority replicas' (same logical value,
    # other insertion orders), and carries its expiry.
    of_a, of_b, of_c = snapshot(a), snapshot(b), snapshot(c)
    assert set(of_c) == set(of_a) == set(of_b) and len(of_c) == 7
    for key, (dump, pttl) in of_c.items():
        if key == b"t:hash" and c.object("encoding", key) == b"hashtable":
            # A hash with field TTLs is a hashtable on Valkey 9, whose DUMP lists fields
            # in table order: the fields, values and each field's TTL, then.
            assert c.hgetall(key) == a.hgetall(key)
            fields = [*c.hkeys(key)]
            ask = ("HPEXPIRETIME", key, "FIELDS", len(fields), *fields)
            assert c.execute_command(*ask) == a.execute_command(*ask)
        else:
            assert dump in (of_a[key][0], of_b[key][0]), key
        if key == b"t:zset":
            # The same expiry, to the 2 s buckets checks compare expiries in.
            assert pttl > 0 and abs(pttl - of_a[key][1]) <= 2000, (pttl, of_a[key][1])
        else:
            assert pttl == of_a[key][1] == -1, key
    assert (await check(group_config(tmp_path, servers))).divergent == 0


async def test_type_specific_writes_rebuild_the_same_value(
    value_kind: str, redis_factory: RedisFactory
) -> None:
    # The fallback for targets that refuse the winner's DUMP format.
    source, target = redis_factory("src"), redis_factory("dst")
    with source.client() as c:
        write_every_type(c)
    src = await RespConnection.open(_endpoint(source), timeout_s=5)
    dst = await RespConnection.open(_endpoint(target), timeout_s=5)
    keys = [b"t:hash", b"t:set", b"t:zset", b"t:list", b"t:stream", b"t:string"]
    types = await observe_keys(src, keys)
    values = await read_values(src, [(k, str(types[k].type)) for k in keys], keep=True)
    states = {k: KeyState(True, v.type, v.digest, None, v.data) for k, v in values.items() if v}
    for key in keys:
        commands = typed_writes(key, states[key])
        dst.check(await dst.request(b"".join(commands), len(commands)))
    rebuilt = await observe_keys(dst, keys)
    assert all(rebuilt[k].same_value(states[k]) for k in keys)
    await src.close()
    await dst.close()


@pytest.mark.parametrize(("newer", "older"), [("valkey-9", "redis-6.2"), ("redis-8", "valkey-9")])
async def test_a_target_refusing_the_winners_dump_format_gets_type_specific_writes(
    tmp_path: Path, redis_factory: RedisFactory, newer: str, older: str
) -> None:
    # Two replicas of a newer server agree; the third, an older server (or one whose DUMP
    # format differs: Redis 8 and Valkey 9), misses every key and holds a stale string:
    # RESTORE there refuses the newer RDB version, so repair falls back to rebuilding each
    # value with type-specific writes, each hash field's TTL with it (HPEXPIREAT). A
    # target without field TTLs (Redis 6.2) gets no copy of the hash that has them: that
    # key is refused by name, never written with fields that would live for ever.
    binaries = {kind: kind_binary(kind) for kind in (newer, older)}
    for kind, (binary, missing) in binaries.items():
        if binary is None:
            pytest.skip(f"server kind {kind}: {missing}")
    with using_server_kind(str(binaries[newer][0])):
        new = [redis_factory("new"), redis_factory("new")]
    with using_server_kind(str(binaries[older][0])):
        old = redis_factory("old")
    for server in new:
        with server.client() as client:
            write_every_type(client)
            client.pexpire(b"t:hash", 600_000)
    with old.client() as client:
        client.set(b"t:string", b"stale")
    with (
        new[0].client() as src,
        old.client() as dst,
        pytest.raises(redis.ResponseError, match="payload"),
    ):
        dst.restore(b"probe", 0, src.dump(b"t:zset"))
    config = group_config(tmp_path, [*new, old])
    report = (await repair(config)).to_dict()
    field_ttls = older != "redis-6.2"
    assert report["repaired"] == (7 if field_ttls else 6), report
    assert report["conflicts"] == 0 and report["busy"] == 0
    # The same digests across server kinds (but the hash refused on Redis 6.2).
    assert (await check(config)).divergent == (0 if field_ttls else 1)
    with new[0].client() as src, old.client() as dst:
        assert dst.get(b"t:string") == src.get(b"t:string")
        assert dst.xrange(b"t:stream") == src.xrange(b"t:stream")
        if not field_ttls:
            errors = [k for k in report["divergent_keys"] if k.get("status") == "error"]
            assert [k["key"] for k in errors] == ["t:hash"], errors
            assert "keeps no field TTLs" in errors[0]["reason"]
            assert dst.exists(b"t:hash") == 0
            return
        ask = ("HPEXPIRETIME", b"t:hash", "FIELDS", 2, b"f0", b"f9")
        assert dst.execute_command(*ask) == src.execute_command(*ask) == [FIELDS_EXPIRE_AT_MS, -1]
        # The TTL carried too: the source's expiry, to the 2 s checks compare expiries in
        # (a busy host's slow test ages both alike; a copy without it would read -1).
        left = src.pttl(b"t:hash")
        assert left > 0 and abs(dst.pttl(b"t:hash") - left) <= 2000, left


def _endpoint(server: RedisServer) -> object:
    from replag.topology import Endpoint

    return Endpoint.from_url(server.url, name=server.name)


async def test_ties_are_conflicts_and_nothing_is_written(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    a_srv, b_srv = redis_factory("tie"), redis_factory("tie")
    with a_srv.client() as a, b_srv.client() as b:
        a.set("k", "one")
        b.set("k", "two")
        report = await repair(group_config(tmp_path, [a_srv, b_srv]))
        assert (a.get("k"), b.get("k")) == (b"one", b"two")
    result = report.to_dict()
    assert result["conflicts"] == 1 and result["repaired"] == 0
    assert "majority" in result["divergent_keys"][0]["reason"]


async def test_source_policy_by_region_and_newest_by_field(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers, (a, b, c) = three(redis_factory)
    a.set("doc", json.dumps({"ts": 5, "v": "old"}))
    b.set("doc", json.dumps({"ts": 9, "v": "new"}))
    c.set("doc", json.dumps({"ts": 5, "v": "old"}))
    a.hset("h", mapping={"updated": "100", "x": "a"})
    b.hset("h", mapping={"updated": "50", "x": "b"})
    c.hset("h", mapping={"updated": "50", "x": "b"})
    config = group_config(tmp_path, servers)
    report = await repair(config, policy="newest:ts")
    # "h" has no "ts": no replica can be called newest, so it is a conflict.
    assert report.to_dict()["repaired"] == 1 and report.to_dict()["conflicts"] == 1
    assert a.get("doc") == c.get("doc") == b.get("doc")
    await repair(config, policy="newest:updated")
    assert b.hget("h", "x") == c.hget("h", "x") == b"a"

    a.set("s", "from-r2?")
    b.set("s", "other")
    c.set("s", "truth")
    report = await repair(config, policy="source:r2")  # region r2 holds only n2
    assert report.to_dict()["repaired"] == 1
    assert a.get("s") == b.get("s") == b"truth"
    with pytest.raises(UsageError, match="no such replica"):
        await repair(config, policy="source:nowhere")


async def test_dry_run_writes_nothing(tmp_path: Path, redis_factory: RedisFactory) -> None:
    servers, clients = three(redis_factory)
    clients[0].set("a", "1")
    clients[1].set("a", "2")
    clients[1].set("a2", "2")
    clients[2].set("a", "2")
    clients[2].set("t", "x", px=100_000)
    before = [snapshot(c) for c in clients]
    report = await repair(group_config(tmp_path, servers), dry_run=True, allow_deletes=True)
    after = [snapshot(c) for c in clients]
    assert [set(s) for s in before] == [set(s) for s in after]
    assert all(before[i][k][0] == after[i][k][0] for i in range(3) for k in before[i])
    assert report.to_dict()["would_repair"] == 3 and report.to_dict()["repaired"] == 0
    assert clients[2].pttl("t") > 0


async def test_deletes_only_with_allow_deletes(tmp_path: Path, redis_factory: RedisFactory) -> None:
    servers, (a, b, c) = three(redis_factory)
    a.set("lonely", "x")
    config = group_config(tmp_path, servers)
    await repair(config, dry_run=False)
    assert b.get("lonely") == c.get("lonely") == b"x"  # copied without --allow-deletes
    b.delete("lonely")
    c.delete("lonely")
    report = await repair(config, allow_deletes=True)
    assert report.to_dict()["repaired"] == 1 and a.exists("lonely") == 0
    a.set("src-lacks", "x")
    b.set("src-lacks", "x")
    report = await repair(config, policy="source:n2")
    assert report.to_dict()["kept"] == 1 and a.exists("src-lacks") == 1
    report = await repair(config, policy="source:n2", allow_deletes=True)
    assert a.exists("src-lacks") == b.exists("src-lacks") == 0


async def test_throttled_repair_reports_busy_time(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers, (a, _, _) = three(redis_factory)
    for i in range(20):
        a.set(f"k{i}", "v")
    report = await repair(group_config(tmp_path, servers), rate=200, max_inflight=2)
    result = report.to_dict()
    assert result["repaired"] == 20
    assert all(r["busy_s"] > 0 for r in result["replicas"])
    # 20 keys → 40 writes at most 200/s per replica: the limiter spaced them out.
    assert result["groups"][0]["repair_s"] >= 19 / 200


def test_cli_exit_codes_json_and_human_report(tmp_path: Path, redis_factory: RedisFactory) -> None:
    a_srv, b_srv = redis_factory("cli"), redis_factory("cli")
    config = group_config(tmp_path, [a_srv, b_srv])
    path = tmp_path / "replag.toml"
    path.write_text(
        render_config(
            config.topology,
            settings={"store": str(tmp_path / "cli.sqlite"), "repair_settle": "10ms"},
        )
    )
    runner = CliRunner()
    ok = runner.invoke(main, ["repair", "check", "--config", str(path)])
    assert ok.exit_code == 0, ok.output
    with a_srv.client() as a:
        a.set(b"\xffbin", b"v")
    found = runner.invoke(main, ["repair", "check", "--config", str(path), "--json"])
    assert found.exit_code == 1, found.output
    data = json.loads(found.output)
    assert data["divergent"] == 1 and data["divergent_keys"][0]["key_b64"] == "/2Jpbg=="
    fixed = runner.invoke(main, ["repair", "run", "--config", str(path)])
    assert fixed.exit_code == 0, fixed.output
    assert "repaired" in fixed.output and "keys/s" in fixed.output
    bad = runner.invoke(main, ["repair", "check", "--config", str(path), "--group", "nope"])
    assert bad.exit_code == 2 and "unknown replica group" in bad.output
    resumed = runner.invoke(main, ["repair", "run", "--config", str(path), "--resume", "x"])
    assert resumed.exit_code == 2 and "no run" in resumed.output


@pytest.mark.parametrize("moment", ["scan", "verify", "write"])
async def test_ctrl_c_leaves_a_resumable_run(
    moment: str, tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # Cancelled (what Ctrl-C does to `replag repair run`) while members are scanned, while
    # keys are verified, or part-way through the throttled writes: the run stops whole
    # (no task of it still running, no coroutine left unawaited: filterwarnings = error
    # fails the test on one) and is resumed to the end.
    servers, (a, b, _) = three(redis_factory)
    for i in range(300):
        a.set(f"k{i}", "v")
    config = group_config(tmp_path, servers)
    store = Store(tmp_path / "replag.sqlite")

    def cancel_in(event: RepairProgress) -> None:
        if event.phase == moment:
            task.cancel()

    task = asyncio.create_task(repair(config, store=store, rate=50, progress=cancel_in))
    if moment == "write":
        # Some keys have reached b (300 take 6 s at 50/s).
        await until(
            lambda: asyncio.to_thread(lambda: b.dbsize() >= 20), "the first repairs", timeout_s=120
        )
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    gc.collect()
    run = list_runs(store)[0]
    assert run["status"] == "interrupted"
    report = await repair(config, store=store, resume=run["run_id"])
    result = report.to_dict()
    assert result["repaired"] + result["agreed"] == 300
    if moment == "write":
        assert result["repaired"] < 300
    assert (await check(config)).divergent == 0
    store.close()


async def test_a_rate_limited_repair_does_not_stretch_ttls(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # The TTL copied is the winner's remaining TTL at the moment of writing: time spent
    # waiting for the rate limiter must not be added to the copy's life.
    servers, (a, b, c) = three(redis_factory)
    for i in range(8):
        a.set(f"t{i}", "v", px=100_000)
        b.set(f"t{i}", "v", px=100_000)
    report = await repair(group_config(tmp_path, servers), rate=4, max_inflight=8)
    assert report.to_dict()["repaired"] == 8
    # Reading a before c, pttl(c) - pttl(a) is at most c's expiry minus a's: a slow read here
    # can only shrink the figure. The limiter held the last of the 8 copies >= 7/4 s, which a
    # stretched TTL would add; the bound is half that, so only the bug can cross it.
    stretch = []
    for i in range(8):
        left_on_a = a.pttl(f"t{i}")
        stretch.append(c.pttl(f"t{i}") - left_on_a)
    assert max(stretch) < 1000 * 7 / 4 / 2, stretch
    assert (await check(group_config(tmp_path, servers))).divergent == 0
