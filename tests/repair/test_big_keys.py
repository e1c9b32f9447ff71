"""Big keys: a 1,000,000-field hash repaired in pages (judged by the servers' own SLOWLOG),
a big stream with consumer groups copied whole so they stay exact, and a repair command
that times out names its key, its replica and the setting."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis

from replag.errors import RepairError
from replag.lab.server import RedisServer
from replag.repair import repair
from replag.repair.keyspace.observe import observe_keys
from replag.repair.keyspace.timeouts import request_within
from replag.store import Store
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, pack
from tests.helpers.configs import group_config
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed
from tests.helpers.waiting import until

FIELDS = 1_000_000
REASSERTED = 200_000
# Builds the hash inside the server (setup only: it holds the server for a second).
BUILD = (
    "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do "
    "redis.call('HSET', KEYS[1], 'f' .. i, 'v' .. i) end"
)
SLOW_US = 50_000  # the server logs every command slower than 50 ms


def endpoint(server: RedisServer) -> Endpoint:
    return Endpoint(name=f"s{server.port}", host="127.0.0.1", port=server.port)


async def test_a_million_field_hash_is_repaired_without_a_slow_command(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("big") for _ in range(3)]
    clients = [s.client() for s in servers]
    for start in range(1, FIELDS, 50_000):
        clients[0].eval(BUILD, 1, "big", start, start + 49_999)
    clients[1].restore("big", 0, clients[0].dump("big"))
    clients[2].hset("big", mapping={f"f{i}": "stale" for i in range(1, 11)})
    for client in clients:
        client.config_set("slowlog-log-slower-than", SLOW_US)
        client.slowlog_reset()
    # Default settings (the helper's short repair_settle aside).
    config = group_config(tmp_path, servers, repair_settle="50ms")
    report = (await repair(config, store=Store(tmp_path / "replag.sqlite"))).to_dict()
    assert report["repaired"] == 1 and report["counts"]["value"] == 1
    assert clients[2].hlen("big") == FIELDS
    states = []
    for server in servers:
        conn = await RespConnection.open(endpoint(server), timeout_s=30)
        try:
            states.append((await observe_keys(conn, [b"big"], keep=False))[b"big"])
        finally:
            await conn.close()
    assert states[0] == states[1] == states[2]
    # The servers' own measurement: no command of the check or the repair took 50 ms.
    for server, client in zip(servers, clients, strict=True):
        slow = [(e["duration"], e["command"][:60]) for e in client.slowlog_get(128)]
        assert slow == [], f"{server.port}: {slow}"
    assert clients[2].keys("replag:*") == []  # no temporary or set-aside key left


async def test_a_command_timeout_names_the_key_the_replica_and_the_setting(
    redis_factory: RedisFactory,
) -> None:
    server = redis_factory("t")
    conn = await RespConnection.open(endpoint(server), timeout_s=10)
    # A script that holds the server (30 million empty Lua iterations: far above 20 ms
    # on any machine; TIME is frozen inside scripts on Redis 7) stands in for a slow RESTORE.
    spin = "local n = 0 for i = 1, 30000000 do n = n + 1 end return n"
    try:
        with pytest.raises(RepairError) as caught:
            await request_within(
                conn, pack(b"EVAL", spin, 0), 1, base_s=0.02, what="writing b'session:42'"
            )
    finally:
        conn.abort()
    # (A fresh connection's PING answers once the script is done: the server stops clean.)
    done = await RespConnection.open(endpoint(server), timeout_s=10)
    await done.request(pack(b"PING"), 1)
    await done.close()
    message = str(caught.value)
    assert "session:42" in message and f"s{server.port}" in message
    assert "repair_command_timeout" in message


def _groups(client: redis.Redis) -> list[tuple[Any, ...]]:
    """The stream's consumer groups as a client sees them: name, last delivered ID,
    consumers and their pending entries (ID, consumer, deliveries)."""
    out: list[tuple[Any, ...]] = []
    for group in client.xinfo_groups("events"):
        pending = client.xpending_range("events", group["name"], "-", "+", 10_000)
        out.append(
            (
                group["name"],
                group["last-delivered-id"],
                sorted(c["name"] for c in client.xinfo_consumers("events", group["name"])),
                [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pending],
            )
        )
    return out


async def test_a_big_stream_with_consumer_groups_keeps_them(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # Above repair_page_elements, but with consumer groups: copied whole (DUMP/RESTORE),
    # the only copy that keeps the groups and their pending entries exact. A big stream
    # without groups and a big hash still go in pages (RENAME of a temporary key).
    servers = [redis_factory("xs") for _ in range(3)]
    clients = [s.client() for s in servers]
    source = clients[0]
    pipe = source.pipeline(transaction=False)
    for i in range(3000):
        pipe.xadd("events", {"n": str(i)})
        pipe.xadd("plain", {"n": str(i)})
        pipe.hset("fields", f"f{i}", "v")
    pipe.execute()
    source.xgroup_create("events", "billing", id="0")
    source.xgroup_create("events", "audit", id="0")
    source.xreadgroup("billing", "worker-1", {"events": ">"}, count=40)
    source.xreadgroup("billing", "worker-2", {"events": ">"}, count=25)
    delivered = source.xreadgroup("audit", "auditor", {"events": ">"}, count=10)
    source.xack("events", "audit", *[entry_id for entry_id, _ in delivered[0][1][:4]])
    for key in ("events", "plain", "fields"):
        clients[1].restore(key, 0, source.dump(key))
    clients[2].xadd("events", {"n": "stale"})  # the third member is behind: repaired
    clients[2].xadd("plain", {"n": "stale"})
    clients[2].hset("fields", "f0", "stale")
    # Every command logged, and all of them kept: the default slowlog-max-len (128) keeps
    # only the last 128, which the pages' XADDs and the re-verification's reads push the
    # RESTORE and RENAMEs out of, depending on the order the keys are repaired in.
    clients[2].config_set("slowlog-log-slower-than", 0)
    clients[2].config_set("slowlog-max-len", 100_000)
    clients[2].slowlog_reset()
    config = group_config(tmp_path, servers, repair_settle="50ms", repair_page_elements=2000)
    report = (await repair(config)).to_dict()
    assert report["repaired"] == 3, report
    assert _groups(clients[2]) == _groups(source) != []
    assert clients[2].xlen("events") == 3000
    logged = clients[2].slowlog_get(100_000)
    assert len(logged) < 100_000  # none dropped
    writes = [e["command"].split()[0] for e in logged]
    assert writes.count(b"RESTORE") == 1  # the stream with groups, whole
    assert writes.count(b"RENAME") == 4  # the others: each renamed aside, then swapped in
    assert clients[2].keys("replag:*") == []


async def test_a_primary_reasserting_a_big_hash_is_never_held_long(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # In a replication group the primary is the only member written: a replica that lost
    # fields of a big hash is fixed by the primary copying its own hash onto itself in
    # pages (a temporary key, then RENAME), which replication carries. Neither the primary
    # nor the replica applying that stream may be held 50 ms by one command. (200,000
    # fields: one RESTORE or COPY of it would take hundreds of ms; a page takes a few.)
    primary = redis_factory("p")
    replica = replica_of(redis_factory, primary, "r")
    wait_listed(primary, [replica])
    with primary.client() as p:
        for start in range(1, REASSERTED, 50_000):
            p.eval(BUILD, 1, "big", start, start + 49_999)
    with replica.client() as r:
        await until(
            lambda: asyncio.to_thread(lambda: r.hlen("big") == REASSERTED),
            "the replica holds the hash",
            timeout_s=120,
        )
        r.config_set("replica-read-only", "no")
        r.hdel("big", *[f"f{i}" for i in range(1, 11)])
    clients = [primary.client(), replica.client()]
    for client in clients:
        client.config_set("slowlog-log-slower-than", SLOW_US)
        client.slowlog_reset()
    config = group_config(tmp_path, [replica, primary], kind="replication", repair_settle="1s")
    report = (await repair(config)).to_dict()
    assert report["repaired"] == 1 and report["resync"] == 0, report
    assert clients[1].hlen("big") == REASSERTED
    for client in clients:
        slow = [(e["duration"], e["command"][:60]) for e in client.slowlog_get(128)]
        assert slow == [], slow
        assert client.keys("replag:*") == []
    for client in clients:
        client.close()
