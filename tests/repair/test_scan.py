"""Scanning and checking real redis-server replicas: types, encodings, TTLs, races, failures."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from replag.errors import RepairError, UsageError
from replag.lab.server import RedisServer
from replag.repair import RepairProgress, check, get_run
from replag.store import Store
from tests.helpers.configs import group_config
from tests.helpers.keyspace import fill, write_every_type
from tests.helpers.redis_servers import RedisFactory


async def test_every_type_agrees_across_encodings_and_differences_are_found(
    value_kind: str, tmp_path: Path, redis_factory: RedisFactory
) -> None:
    plain = redis_factory("plain")
    # Force hashtable/skiplist/linkedlist encodings on the second server.
    encoded = redis_factory(
        "encoded",
        extra_args=(
            "--hash-max-ziplist-entries",
            "0",
            "--set-max-intset-entries",
            "0",
            "--zset-max-ziplist-entries",
            "0",
            "--list-max-ziplist-size",
            "1",
        ),
    )
    with plain.client() as a, encoded.client() as b:
        write_every_type(a)
        write_every_type(b, reverse=True)
        # (A hash with field TTLs is a hashtable on Valkey 9 whatever the settings.)
        if value_kind != "valkey-9":
            assert a.object("encoding", b"t:hash") != b.object("encoding", b"t:hash")
        assert a.object("encoding", b"t:set") != b.object("encoding", b"t:set")
        config = group_config(tmp_path, [plain, encoded])
        report = await check(config)
        assert report.divergent == 0, report.to_dict()["divergent_keys"]

        b.hset(b"t:hash", b"f7", b"other")
        b.srem(b"t:set", 39)
        b.zadd(b"t:zset", {"m3": 99})
        b.lset(b"t:list", 5, b"moved")
        b.xadd(b"t:stream", {b"n": b"new"}, id="9-0")
        b.set(b"t:string", b"\xfe\xff not utf-8 \x01")
        b.set(b"\xff\xfe\x00bin-key", b"other")
        report = await check(config)
    result = report.to_dict()
    assert result["counts"] == {"missing": 0, "type": 0, "value": 7, "ttl": 0}
    keys = {k.get("key") or base64.b64decode(k["key_b64"]) for k in result["divergent_keys"]}
    assert b"\xff\xfe\x00bin-key" in keys and "t:hash" in keys


async def test_a_200000_field_hash_is_read_in_chunks(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("big"), redis_factory("big")]
    for server in servers:
        with server.client() as c:
            pipe = c.pipeline(transaction=False)
            for start in range(0, 200_000, 5000):
                pipe.hset(
                    b"huge", mapping={b"f%d" % i: b"v%d" % i for i in range(start, start + 5000)}
                )
            pipe.execute()
            assert c.hlen(b"huge") == 200_000 and c.object("encoding", b"huge") == b"hashtable"
    config = group_config(tmp_path, servers)
    assert (await check(config)).divergent == 0
    with servers[1].client() as c:
        c.hset(b"huge", b"f123456", b"changed")
    report = await check(config)
    assert report.to_dict()["counts"]["value"] == 1


async def test_ttls_compare_as_absolute_expiry_with_tolerance(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    a, b = redis_factory("ttl"), redis_factory("ttl")
    with a.client() as ca, b.client() as cb:
        ca.set("close", "v", px=100_000)
        cb.set("close", "v", px=100_700)  # within the 2 s tolerance
        ca.set("far", "v", px=100_000)
        cb.set("far", "v", px=200_000)
        ca.set("persistent-vs-ttl", "v")
        cb.set("persistent-vs-ttl", "v", px=500_000)
        report = await check(group_config(tmp_path, [a, b]))
    result = report.to_dict()
    assert result["counts"]["ttl"] == 2
    assert {k["key"] for k in result["divergent_keys"]} == {"far", "persistent-vs-ttl"}


async def test_keys_expiring_or_deleted_during_the_scan_are_not_reported(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("exp"), redis_factory("exp")]
    clients = [s.client() for s in servers]
    for c in clients:
        fill(c, 5000)
        for i in range(300):
            c.set(f"volatile:{i}", "v", px=600_000)
            c.set(f"doomed:{i}", "v")
    fired = []

    def expire_when_first_replica_is_done(event: RepairProgress) -> None:
        # The first replica has been scanned with these keys; now they go away everywhere,
        # before the second replica's scan starts (one at a time).
        done = event.total is not None and event.done >= event.total
        if event.phase == "scan" and event.replica == "n0" and done and not fired:
            fired.append(True)
            for c in clients:
                for i in range(300):
                    c.pexpire(f"volatile:{i}", 1)
                    c.delete(f"doomed:{i}")

    config = group_config(tmp_path, servers, scan_count=100, scan_parallel=1)
    report = await check(config, progress=expire_when_first_replica_is_done)
    for c in clients:
        c.close()
    assert fired
    assert report.groups[0].candidates > 0  # the trees did see them differ…
    assert report.divergent == 0  # …and the verification read dropped them


async def test_a_replica_dying_mid_scan_fails_clearly_and_the_run_resumes(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("die"), redis_factory("die"), redis_factory("die")]
    for s in servers:
        with s.client() as c:
            fill(c, 20_000)
    # One replica at a time, and slowly enough that the kill lands mid-scan of n1 (its
    # progress reaches us from its scan process while it goes on).
    config = group_config(tmp_path, servers, scan_count=200, scan_parallel=1, scan_rate=10_000)
    store = Store(tmp_path / "replag.sqlite")
    victim = servers[1]

    def kill_mid_scan(event: RepairProgress) -> None:
        if event.replica == "n1" and event.done > 0 and victim.pid is not None:
            victim.kill()

    with pytest.raises(RepairError) as caught:
        await check(config, store=store, progress=kill_mid_scan)
    message = str(caught.value)
    assert "n1" in message and "--resume" in message
    run_id = message.rsplit("--resume ", 1)[1].split("`")[0]
    run = get_run(store, run_id)
    assert run is not None and run["status"] == "failed"

    # The replica comes back with its data; the resumed run does not rescan n0.
    replacement = RedisServer(name="die-again", port=victim.port, workdir=tmp_path / "redis2")
    replacement.start()
    try:
        with replacement.client() as c:
            fill(c, 20_000)
        rescanned: set[str] = set()
        report = await check(
            group_config(tmp_path, servers, scan_count=200),
            store=store,
            resume=run_id,
            progress=lambda e: rescanned.add(e.replica),
        )
    finally:
        replacement.stop()
    assert report.run_id == run_id and report.divergent == 0
    assert "n0" not in rescanned and "n1" in rescanned
    assert report.to_dict()["replicas"][0]["keys_scanned"] == 20_000
    run = get_run(store, run_id)
    assert run is not None and run["status"] == "done"
    store.close()


async def test_an_unreachable_replica_is_one_clear_error(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    alive = redis_factory("up")
    dead = redis_factory("down")
    config = group_config(tmp_path, [alive, dead], connect_timeout="1s")
    dead.stop()
    with pytest.raises(RepairError, match=r"n1.*unreachable.*nothing was scanned"):
        await asyncio.wait_for(check(config), 30)


async def test_probe_keys_in_flight_are_not_divergence(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("p"), redis_factory("p")]
    for s in servers:
        with s.client() as c:
            fill(c, 100)
    with servers[0].client() as c:  # a probe key that has not reached the other replica yet
        c.set("replag:probe:abc:1", "1|a|abc|1", px=60_000)
        c.set("k:only-here", "real divergence")
    report = await check(group_config(tmp_path, servers))
    keys = [k["key"] for k in report.to_dict()["divergent_keys"]]
    assert keys == ["k:only-here"]


async def test_ignoring_ttls_reports_values_not_expiries_and_reads_no_ttl(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    a, b = redis_factory("ttl-ignored"), redis_factory("ttl-ignored")
    with a.client() as ca, b.client() as cb:
        for client in (ca, cb):
            fill(client, 400)
            client.set("both-expire", "v", px=300_000)
        ca.set("far", "v", px=100_000)
        cb.set("far", "v", px=200_000)
        ca.set("persistent-vs-ttl", "v")
        cb.set("persistent-vs-ttl", "v", px=500_000)
        ca.set("value", "one", px=100_000)
        cb.set("value", "two")
        ca.set("missing", "here", px=100_000)
        for client in (ca, cb):
            client.config_resetstat()
        config = group_config(tmp_path, [a, b])
        seen: list[RepairProgress] = []
        report = (await check(config, ttls="ignore", progress=seen.append)).to_dict()
        # The scans read values only: no TTL script, no PTTL but the verification's own
        # (TYPE, PTTL and GET per candidate, twice).
        for client in (ca, cb):
            stats = client.info("commandstats")
            assert "cmdstat_evalsha" not in stats and "cmdstat_eval" not in stats
            assert stats.get("cmdstat_pttl", {"calls": 0})["calls"] <= 2 * 2
        compared = (await check(config)).to_dict()
    assert report["ttls"] == "ignore" and compared["ttls"] == "compare"
    assert report["counts"] == {"missing": 1, "type": 0, "value": 1, "ttl": 0}
    assert {k["key"] for k in report["divergent_keys"]} == {"value", "missing"}
    assert compared["counts"] == {"missing": 1, "type": 0, "value": 1, "ttl": 2}
    assert [e.done for e in seen if e.phase == "verify"][-1] == 2


async def test_a_bad_ttls_choice_is_a_usage_error(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    a, b = redis_factory("ttls-bad"), redis_factory("ttls-bad")
    with pytest.raises(UsageError, match="--ttls: expected one of compare, ignore"):
        await check(group_config(tmp_path, [a, b]), ttls="never")


async def test_every_verification_batch_is_judged_once_and_in_order(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # 1,300 divergent keys: six batches, four read at once (their settling overlaps).
    a, b = redis_factory("many"), redis_factory("many")
    with a.client() as ca, b.client() as cb:
        fill(ca, 1500)
        fill(cb, 1500)
        pipe = cb.pipeline(transaction=False)
        for i in range(1300):
            pipe.set(f"k:{i:07d}", "changed")
        pipe.execute()
        seen: list[RepairProgress] = []
        found: list[bytes] = []
        report = await check(
            group_config(tmp_path, [a, b], repair_settle="50ms"),
            progress=seen.append,
            key_sink=lambda group, key, detail: found.append(key),
        )
    assert report.to_dict()["counts"]["value"] == 1300
    assert sorted(found) == [f"k:{i:07d}".encode() for i in range(1300)] == sorted(set(found))
    done = [e.done for e in seen if e.phase == "verify"]
    assert done == sorted(done) and done[-1] == 1300 and len(done) == 6
