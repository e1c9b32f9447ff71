"""Hash-field TTLs are part of a hash: compared, reported, and carried by every copy.

On the servers that have them (Redis 8, Valkey 9): a field TTL on one replica only,
different field TTLs and an HPERSIST are `ttl` divergence naming the fields; a field
expired but not reclaimed (a server without active expiry; a replica, which never
reclaims) is absent, not "changing"; a repair copies field TTLs by DUMP/RESTORE, in
pages (inside the temporary key, before the swap), by rebuild, and between servers
whose DUMP formats differ (typed writes with HPEXPIREAT); a target without field
TTLs (Redis 7) is a named refusal, never a copy that lives for ever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from replag.lab.server import RedisServer
from replag.repair import check, repair
from replag.repair.rebuild import rebuild
from tests.helpers.configs import group_config
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed
from tests.helpers.server_kinds import CURRENT_KINDS, kind_binary, using_server_kind
from tests.helpers.waiting import until

HOUR_MS = 3_600_000


@pytest.fixture(params=CURRENT_KINDS)
def current_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    kind: str = request.param
    binary, missing = kind_binary(kind)
    if binary is None:
        pytest.skip(f"server kind {kind}: {missing}")
    with using_server_kind(binary):
        yield kind


def _at(offset_ms: int) -> int:
    return int(time.time() * 1000) + offset_ms


def _expire_at(client: redis.Redis, key: str, at_ms: int, *fields: str) -> None:
    client.execute_command("HPEXPIREAT", key, at_ms, "FIELDS", len(fields), *fields)


def _expiry(client: redis.Redis, key: str, *fields: str) -> list[int]:
    return list(client.execute_command("HPEXPIRETIME", key, "FIELDS", len(fields), *fields))


def _hash(client: redis.Redis, key: str, size: int) -> None:
    pipe = client.pipeline(transaction=False)
    items = [(f"f{i}", f"v{i}") for i in range(size)]
    for start in range(0, size, 1000):
        pipe.hset(key, mapping=dict(items[start : start + 1000]))
    pipe.execute()


async def test_field_ttl_differences_are_ttl_divergence_naming_the_fields(
    current_kind: str, tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("a"), redis_factory("b")]
    a, b = (s.client() for s in servers)
    at = _at(HOUR_MS)
    for client in (a, b):
        for key in ("one-only", "different", "persisted", "same"):
            client.hset(key, mapping={"x": "1", "y": "2", "z": "3"})
        _expire_at(client, "same", at, "x", "y")
        _expire_at(client, "persisted", at, "y")
    _expire_at(a, "one-only", at, "x")
    _expire_at(a, "different", at, "z")
    _expire_at(b, "different", _at(60_000), "z")
    b.execute_command("HPERSIST", "persisted", "FIELDS", 1, "y")
    found = (await check(group_config(tmp_path, servers, kind="peers"))).to_dict()
    assert found["divergent"] == 3 and found["counts"]["ttl"] == 3, found
    by_key = {d["key"]: d for d in found["divergent_keys"]}
    assert set(by_key) == {"one-only", "different", "persisted"}
    assert by_key["different"]["fields"] == {"differing": 1, "named": ["z"]}
    assert by_key["one-only"]["fields"]["named"] == ["x"]
    assert found["groups"][0]["changing_during_check"] == 0

    # Quorum of three: c (no field TTLs) is outvoted where a and b agree ("same"), and
    # sides with b on "persisted": a's field TTL goes, c's copy of "same" carries both.
    c = redis_factory("c")
    with c.client() as cc:
        for key in ("same", "persisted"):
            cc.hset(key, mapping={"x": "1", "y": "2", "z": "3"})
    report = (await repair(group_config(tmp_path, [*servers, c], kind="peers"))).to_dict()
    assert report["busy"] == 0, report
    with c.client() as cc:
        assert _expiry(cc, "same", "x", "y", "z") == [at, at, -1]
    assert _expiry(a, "persisted", "x", "y", "z") == [-1, -1, -1]


async def test_a_field_expired_but_not_reclaimed_is_absent_not_changing(
    current_kind: str, tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # A primary without active expiry, and its replica (which never reclaims): both count
    # the expired field in HLEN, HSCAN leaves it out.
    primary = redis_factory("p", extra_args=("--enable-debug-command", "yes"))
    with primary.client() as p:
        p.execute_command("DEBUG", "SET-ACTIVE-EXPIRE", "0")
    replica = replica_of(redis_factory, primary, "r")
    wait_listed(primary, [replica])
    with primary.client() as p:
        p.hset("h", mapping={"gone": "1", "kept": "2"})
        p.execute_command("HPEXPIRE", "h", 50, "FIELDS", 1, "gone")
        _hash(p, "big", 3000)
        p.execute_command("HPEXPIRE", "big", 50, "FIELDS", 2, "f1", "f2")
        p.execute_command("HPEXPIRE", "big", HOUR_MS, "FIELDS", 1, "f3")
    with replica.client() as r:
        await until(lambda: asyncio.to_thread(lambda: r.hlen("big") == 3000), "big replicated")
    await asyncio.sleep(0.2)
    for server in (primary, replica):
        with server.client() as client:
            assert client.hlen("h") == 2 and client.hscan("h")[1] == {b"kept": b"2"}
    peer = redis_factory("q")  # never had the expired fields
    with peer.client() as q:
        q.hset("h", "kept", "2")
        _hash(q, "big", 3000)
        q.hdel("big", "f1", "f2")
        _expire_at(q, "big", _expiry(primary.client(), "big", "f3")[0], "f3")
    found = (await check(group_config(tmp_path, [primary, replica, peer], kind="peers"))).to_dict()
    assert found["groups"][0]["changing_during_check"] == 0, found
    assert found["divergent"] == 0, found


async def test_field_ttls_are_carried_by_pages_by_rebuild_and_onto_the_primary(
    current_kind: str, tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # A 200,000-field hash (above repair_page_elements: copied in pages) with field TTLs,
    # as the issue asks: the longest test here (each full read of it is a second or two,
    # and a repair reads it on every member several times).
    servers = [redis_factory("a"), redis_factory("b"), redis_factory("c")]
    a, b, c = (s.client() for s in servers)
    at, soon = _at(HOUR_MS), _at(HOUR_MS // 2)
    for client in (a, b):
        _hash(client, "huge", 200_000)
        _expire_at(client, "huge", at, *[f"f{i}" for i in range(0, 200_000, 2)])
        _expire_at(client, "huge", soon, "f1", "f3")
    _hash(c, "huge", 200_000)  # the same fields and values, no field TTLs
    config = group_config(tmp_path, servers, kind="peers")
    report = (await repair(config)).to_dict()
    assert report["repaired"] == 1 and report["counts"]["ttl"] == 1, report
    assert report["divergent_keys"][0]["fields"]["differing"] == 100_002
    assert _expiry(c, "huge", "f0", "f1", "f3", "f5", "f199998") == [at, soon, soon, -1, at]

    # Rebuilt onto an empty member: in pages again, each field's TTL with it.
    c.delete("huge")
    done = (await rebuild(config, group="g", replica="n2", closing_pass=False)).to_dict()
    assert done["big_copied"] == 1, done
    assert _expiry(c, "huge", "f0", "f1", "f5", "f199998") == [at, soon, -1, at]


async def test_a_writable_replica_leaves_the_primarys_field_ttls_intact(
    current_kind: str, tmp_path: Path, redis_factory: RedisFactory
) -> None:
    primary = redis_factory("p")
    writable = replica_of(redis_factory, primary, "w")
    with writable.client() as w:
        w.config_set("replica-read-only", "no")
    wait_listed(primary, [writable])
    at = _at(HOUR_MS)
    with primary.client() as p:
        _hash(p, "h", 2001)
        _expire_at(p, "h", at, *[f"f{i}" for i in range(0, 2001, 3)])
    with writable.client() as w:
        await until(lambda: asyncio.to_thread(lambda: w.hlen("h") == 2001), "replicated")
        w.hset("h", "f7", "changed on the replica")
    config = group_config(tmp_path, [primary, writable])
    report = (await repair(config)).to_dict()
    assert report["repaired"] == 1, report
    for server in (primary, writable):
        with server.client() as client:
            await until(
                lambda client=client: asyncio.to_thread(lambda: client.hget("h", "f7") == b"v7"),
                "the primary's value everywhere",
            )
            assert _expiry(client, "h", "f0", "f1", "f3", "f2001") == [at, -1, at, -2]
    assert (await check(config)).divergent == 0


def _kind(kind: str) -> str:
    binary, missing = kind_binary(kind)
    if binary is None:
        pytest.skip(f"server kind {kind}: {missing}")
    return binary


def _started(redis_factory: RedisFactory, kind: str, name: str) -> RedisServer:
    with using_server_kind(_kind(kind)):
        return redis_factory(name)


@pytest.mark.parametrize("size", [3, 2500])
async def test_redis_8_to_valkey_9_carries_field_ttls_and_redis_7_is_refused_by_name(
    tmp_path: Path, redis_factory: RedisFactory, size: int
) -> None:
    # DUMP formats differ between Redis 8 and Valkey 9 (RESTORE: "DUMP payload version or
    # checksum are wrong"): typed writes carry each field's TTL (HPEXPIREAT). Redis 7
    # keeps no field TTLs: the key is refused there, by name, and not written.
    r8 = [_started(redis_factory, "redis-8", n) for n in ("a", "b")]
    v9 = _started(redis_factory, "valkey-9", "v")
    r7 = _started(redis_factory, "redis-7", "old")
    at = _at(HOUR_MS)
    for server in r8:
        with server.client() as client:
            _hash(client, "h", size)
            _expire_at(client, "h", at, "f0", "f2")
    report = (await repair(group_config(tmp_path, [*r8, v9], kind="peers"))).to_dict()
    assert report["repaired"] == 1, report
    with v9.client() as v:
        assert _expiry(v, "h", "f0", "f1", "f2") == [at, -1, at]
    # (A refused target leaves the key unrepaired on every member: its copies elsewhere
    # are undone with it, so Redis 7 is a group of its own here.)
    report = (await repair(group_config(tmp_path, [*r8, r7], kind="peers"))).to_dict()
    with r7.client() as old:
        assert old.exists("h") == 0
    errors = [k for k in report["divergent_keys"] if k.get("status") == "error"]
    assert [k["key"] for k in errors] == ["h"], report
    assert errors[0]["reason"].startswith("n2 refused: "), errors[0]
    assert "keeps no field TTLs" in errors[0]["reason"], errors[0]


def test_field_expiries_cross_to_and_from_an_agent_and_compare_with_the_tolerance() -> None:
    from replag.repair.keyspace.field_ttls import FieldExpiries, keys_with_volatile_fields
    from replag.repair.keyspace.observe import KeyState
    from replag.repair.trees.remote import state_from_wire, state_to_wire

    expiries = FieldExpiries.of([b"a", b"b\xff"], [1_000_000, 2_000_000])
    state = KeyState(True, "hash", 7, None, field_expiries=expiries)
    back = state_from_wire(state_to_wire(state), where="agent")
    assert back.field_expiries is not None
    assert sorted(back.field_expiries.items()) == [(b"a", 1_000_000), (b"b\xff", 2_000_000)]
    assert back.same_as(state, 0)
    near = KeyState(
        True,
        "hash",
        7,
        None,
        field_expiries=FieldExpiries.of([b"a", b"b\xff"], [1_000_900, 2_000_000]),
    )
    assert near.same_as(state, 1000) and not near.same_as(state, 500)
    assert not KeyState(True, "hash", 7, None).same_as(state, 10**9)  # none on one side
    # INFO keyspace: Redis 8 says subexpiry, Valkey 9 keys_with_volatile_items, older none.
    assert keys_with_volatile_fields(b"db0:keys=2,expires=0,avg_ttl=0,subexpiry=1\r\n", 0) == 1
    valkey = b"# Keyspace\r\ndb3:keys=9,expires=1,avg_ttl=0,keys_with_volatile_items=0\r\n"
    assert keys_with_volatile_fields(valkey, 3) == 0
    assert keys_with_volatile_fields(b"db0:keys=2,expires=0,avg_ttl=0\r\n", 0) is None


def test_a_few_fields_digest_as_many_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from replag.repair.keyspace import field_ttls

    names = [f"f{i}".encode() for i in range(5)]
    times = [1_796_000_000_000 + 997 * i for i in range(5)]
    few = field_ttls.FieldExpiries.of(names, times)
    monkeypatch.setattr(field_ttls, "_FEW", 0)  # the arrays' way, as for many fields
    many = field_ttls.FieldExpiries.of(names, times)
    assert few is not None and many is not None
    assert few.hashes.tolist() == many.hashes.tolist() and few.names == many.names
    assert many.bucket_digest(2000) == field_ttls.FieldExpiries.bucket_digest(few, 2000)
    monkeypatch.setattr(field_ttls, "_FEW", 32)
    assert few.bucket_digest(2000) == many.bucket_digest(2000)
