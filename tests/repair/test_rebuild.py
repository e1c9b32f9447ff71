"""`repair rebuild` and the bulk refill against real servers: what is copied, what is never
overwritten, a delete racing the copy, a Redis replica refused with the way to resync it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonschema
from click.testing import CliRunner

from replag.cli import main
from replag.config import Config, render_config
from replag.lab.server import RedisServer
from replag.repair import check, list_runs, repair
from replag.repair.bulk.copy import bulk_allowed
from replag.repair.bulk.rebuild_log import RebuildLog
from replag.repair.bulk.refill import Refill
from replag.repair.decisions.policy import Majority, Newest, Quorum, Source
from replag.repair.keyspace.observe import KeyState, observe_keys
from replag.repair.rebuild import rebuild
from replag.schemas import schema
from replag.store import Store
from replag.topology import Endpoint
from replag.wire.resp import RespConnection
from tests.helpers.cli import spawn_replag
from tests.helpers.configs import group_config
from tests.helpers.keyspace import fill, write_every_type
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed
from tests.helpers.waiting import until, wait_until


def config_file(tmp_path: Path, config: Config) -> Path:
    path = tmp_path / "replag.toml"
    settings = {"store": config.settings.store, "repair_settle": "10ms"}
    path.write_text(render_config(config.topology, settings=settings))
    return path


def endpoint(server: RedisServer, name: str) -> Endpoint:
    return Endpoint(name=name, host="127.0.0.1", port=server.port)


async def states(server: RedisServer, keys: list[bytes]) -> dict[bytes, KeyState]:
    conn = await RespConnection.open(endpoint(server, "x"), timeout_s=10)
    try:
        return dict(await observe_keys(conn, keys, keep=False))
    finally:
        await conn.close()


async def test_rebuild_copies_what_peers_agree_on_and_overwrites_nothing(
    value_kind: str, tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("p") for _ in range(3)]
    a, b, c = (s.client() for s in servers)
    for client in (a, b):
        fill(client, 1500, size=200)
        client.set("ttl", "v", px=600_000)
        for i in range(300):  # a big hash: copied in pages (repair_page_elements = 50)
            client.hset("big", f"f{i}", f"v{i}")
        client.rpush("biglist", *[f"e{i}" for i in range(120)])
    write_every_type(a)
    write_every_type(b, reverse=True)  # same values, other insertion order
    a.set("disputed", "1")
    b.set("disputed", "2")
    a.set("client-wrote", "old")
    b.set("client-wrote", "old")
    c.set("client-wrote", "new")  # written on the target before the copy: it stays
    config = group_config(tmp_path, servers, repair_page_elements=50)
    store = Store(tmp_path / "replag.sqlite")
    report = await rebuild(
        config, group="g", replica="n2", store=store, closing_pass=False, source="n0"
    )
    d = report.to_dict()
    assert d["plan"]["source_keys"] == a.dbsize() and d["plan"]["target_keys"] == 1
    assert d["present"] == 1 and d["disagree"] == 1 and d["big_copied"] == 2
    assert c.get("client-wrote") == b"new" and c.get("disputed") is None
    keys = [k for k in a.scan_iter(count=1000) if k not in (b"disputed", b"client-wrote")]
    assert d["copied"] + d["big_copied"] == len(keys)
    want, got = await states(servers[0], keys), await states(servers[2], keys)
    differ = [k for k in keys if not got[k].same_as(want[k], 1000)]
    assert differ == []  # type, canonical digest and expiry (within 1 s) of every key
    assert 0 < c.pttl("ttl") <= 600_000
    leftovers = [k for k in c.scan_iter(match="replag:*")]
    assert leftovers == []  # no temporary key of the page copier is left behind
    # The anti-entropy pass then settles what the bulk copy left.
    again = await rebuild(config, group="g", replica="n2", store=store)
    assert again.to_dict()["copied"] == 0
    assert again.closing is not None and again.closing["conflicts"] == 1  # "disputed": 1 v 2
    store.close()


async def test_a_delete_racing_the_copy_is_undone(redis_factory: RedisFactory) -> None:
    """A DEL the target applied before the copy (of a key it lacked: nothing to see) and
    the peers only afterwards: the copy would resurrect the key. The batch's check
    `repair_settle` later sees the peers changed, reads the copies back and deletes it."""
    servers = [redis_factory("d") for _ in range(3)]
    a, b, c = (s.client() for s in servers)
    for client in (a, b):
        fill(client, 50)
        client.hset("victim", mapping={f"f{i}": i for i in range(10)})
    peers = [endpoint(servers[0], "n0"), endpoint(servers[1], "n1")]
    refill = Refill(
        peers,
        endpoint(servers[2], "n2"),
        settle_s=3.0,
        tolerance_ms=2000,
        timeout_s=10,
        page_elements=1000,
    )
    keys = sorted(a.scan_iter(count=100))
    victim = b"victim"  # a hash: copied by DUMP, its digest then read back from the payload
    try:
        copying = asyncio.ensure_future(refill.copy(keys))
        await until(lambda: c.exists(victim) == 1, "the copy written")
        a.delete(victim)  # the delete reaches the peers within repair_settle
        b.delete(victim)
        result = await copying
    finally:
        await refill.close()
    assert result.verified_by_read
    assert result.changed == [victim] and result.copied == len(keys) - 1
    assert c.exists(victim) == 0 and c.dbsize() == len(keys) - 1


def test_rebuild_of_a_redis_replica_says_how_redis_resyncs_it(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    primary = redis_factory("m")
    replica = replica_of(redis_factory, primary, "s")
    wait_listed(primary, [replica])
    config = group_config(tmp_path, [primary, replica])
    path = config_file(tmp_path, config)
    result = CliRunner().invoke(main, ["repair", "rebuild", "-c", str(path), "-g", "g", "-r", "n1"])
    assert result.exit_code == 2
    assert "Redis replica of" in result.output and "REPLICAOF NO ONE" in result.output
    assert "Traceback" not in result.output
    # A group declared a replication group: no member of it is rebuilt by copying.
    path.write_text(path.read_text().replace('name = "g"', 'name = "g"\nkind = "replication"'))
    result = CliRunner().invoke(main, ["repair", "rebuild", "-c", str(path), "-g", "g", "-r", "n0"])
    assert result.exit_code == 2 and "replication group" in result.output, result.output


def test_dry_run_prints_the_plan_and_writes_nothing(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("y") for _ in range(3)]
    for server in servers[:2]:
        fill(server.client(), 400)
    config = group_config(tmp_path, servers)
    path = config_file(tmp_path, config)
    args = ["repair", "rebuild", "-c", str(path), "-g", "g", "-r", "n2", "--dry-run"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "about 400 keys" in result.output and "keys/s" in result.output
    assert servers[2].client().dbsize() == 0
    result = CliRunner().invoke(main, [*args, "--json"])
    plan = json.loads(result.output)["plan"]
    assert plan["keys"] == 400 and plan["source_keys"] == 400
    # Done for real, --json follows its published schema; `repair runs` lists the run.
    result = CliRunner().invoke(main, [*args[:-1], "--json"])
    assert result.exit_code == 0, result.output
    done = json.loads(result.output)
    jsonschema.validate(done, schema("rebuild"))
    assert done["copied"] == 400 and done["closing"]["divergent"] == 0
    listed = CliRunner().invoke(main, ["repair", "runs", "-c", str(path), "--json"])
    jsonschema.validate(json.loads(listed.output), schema("runs"))
    human = CliRunner().invoke(main, ["repair", "runs", "-c", str(path)])
    assert "rebuild n2" in human.output and "copied 400 keys" in human.output


async def test_repair_run_refills_a_wiped_replica_in_bulk(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    """`repair run` itself takes the bulk path when a member lacks many keys its peers
    agree on; what else differs goes through the key-by-key path as before."""
    servers = [redis_factory("w") for _ in range(3)]
    a, b, c = (s.client() for s in servers)
    for client in (a, b):
        fill(client, 3000)
        write_every_type(client)
        client.set("expiring", "x", px=900_000)
        client.set("stale-on-c", "new")
    c.set("stale-on-c", "old")  # the one key c holds: differs in value
    a.set("only-on-a", "1")  # peers disagree: not bulk, quorum copies it key by key
    config = group_config(tmp_path, servers)
    report = await repair(config, store=Store(tmp_path / "replag.sqlite"))
    group = report.to_dict()["groups"][0]
    assert group["bulk_refilled"] >= 3000
    assert report.to_dict()["repaired"] == report.divergent  # bulk and key by key
    assert c.get("only-on-a") == b"1"
    again = await check(config)
    assert again.divergent == 0
    assert c.get("stale-on-c") == b"new" and 0 < c.pttl("expiring") <= 900_000


def test_kill_9_mid_rebuild_then_resume_ends_equal(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("k") for _ in range(3)]
    a, b, c = (s.client() for s in servers)
    for client in (a, b):
        fill(client, 12_000, size=100)
    path = config_file(tmp_path, group_config(tmp_path, servers))
    args = ["repair", "rebuild", "-c", str(path), "-g", "g", "-r", "n2", "--rate", "2000"]
    process = spawn_replag(*args, log=tmp_path / "rebuild.log")
    try:
        wait_until(lambda: int(c.dbsize()) >= 3000, "the rebuild copies", timeout_s=120)
    finally:
        process.kill()  # kill -9: no handler runs, nothing is saved on the way out
        process.wait()
    assert int(c.dbsize()) < 12_000
    store = Store(tmp_path / "replag.sqlite")
    (run,) = list_runs(store)
    assert run["kind"] == "rebuild" and run["status"] == "running"
    # A batch the crash left unverified whose key a client deleted meanwhile (the delete
    # reached the target before the copy, the peers after): the resume deletes the copy.
    raced = next(k for k in c.scan_iter(count=100))
    a.delete(raced)
    b.delete(raced)
    RebuildLog(store, run["run_id"]).add_pending(10**6, [raced])
    store.close()
    result = CliRunner().invoke(
        main, ["repair", "rebuild", "-c", str(path), "--resume", run["run_id"], "--json"]
    )
    assert result.exit_code == 0, result.output
    done = json.loads(result.output)
    assert done["settled_on_resume"] >= 1 and done["closing"]["divergent"] == 0
    assert c.exists(raced) == 0 and c.dbsize() == a.dbsize() == 11_999
    keys = sorted(a.scan_iter(count=1000))
    assert c.mget(keys) == a.mget(keys)


def test_which_policies_take_the_bulk_path() -> None:
    assert bulk_allowed(Quorum(), 2, 3, allow_deletes=True)
    assert bulk_allowed(Majority(), 2, 3, allow_deletes=False)
    assert not bulk_allowed(Majority(), 1, 2, allow_deletes=False)  # two racks: a tie
    assert not bulk_allowed(Majority(cut_off=("r1", "r2")), 2, 3, allow_deletes=False)
    assert bulk_allowed(Source(0, "n0"), 2, 3, allow_deletes=False)
    assert not bulk_allowed(Source(2, "n2"), 2, 3, allow_deletes=False)
    assert not bulk_allowed(Newest("ts"), 2, 3, allow_deletes=False)
