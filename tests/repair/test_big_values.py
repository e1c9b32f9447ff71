"""Values bigger than max_reply_bytes allows in one reply (issue 33): a scan's batch
whose reply is refused is read again in halves, and a string longer than the limit is
hashed in GETRANGE pages, so the scan gives the index it gives under the default limit;
collections are read in pages sized by their elements' bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from replag.config import Config, config_from_dict
from replag.repair import check, repair
from replag.repair.keyspace.digest import string_digest
from replag.repair.keyspace.values import ReadValue, read_values
from replag.repair.scan.blocking import BlockingScan
from replag.repair.scan.scanner import ReplicaScanner, ScanIndex, ScanOptions, ScanProgress
from replag.topology import Endpoint
from replag.wire.reply_limits import ReplyLimits
from replag.wire.resp import RespConnection
from tests.helpers.redis_servers import RedisFactory, RedisServer

LIMIT = ReplyLimits(max_bytes=1 << 20)


@pytest.fixture
def big(redis_factory: RedisFactory) -> RedisServer:
    server = redis_factory("big")
    with server.client() as client:
        for i in range(20):
            client.set(f"v:{i:02d}", bytes([i]) * (300 << 10))
        client.set("huge", b"0123456789abcdef" * (3 << 16))  # 3 MB
        # Mid-bucket: two scans' reading of it cannot straddle a 2 s bucket's edge.
        client.pexpireat("v:03", (int(time.time() * 1000) // 2000 + 1800) * 2000 + 1000)
        client.rpush("list", b"a", b"b")
        for i in range(200):
            client.set(f"s:{i:03d}", f"small {i}")
    return server


def entries(index: ScanIndex) -> list[tuple[bytes, int, int]]:
    return sorted(
        (index.key(i), int(index.key_hashes[i]), int(index.entries[i])) for i in range(len(index))
    )


def test_a_scan_under_a_low_reply_limit_indexes_what_it_indexes_without(big: RedisServer) -> None:
    endpoint = Endpoint.from_url(big.url, name="big")
    expected = BlockingScan(endpoint, ScanOptions(count=1000)).run(ScanProgress("big"))
    scan = BlockingScan(endpoint, ScanOptions(count=1000, reply_limits=LIMIT))
    state = ScanProgress("big")
    got = scan.run(state)
    assert entries(got) == entries(expected)
    assert len(got) == 20 + 1 + 1 + 200
    assert state.finished and state.cursor == b"0"
    assert scan._big_strings == 1  # "huge", in pages; the 300 KB values in smaller batches


def _fill(server: RedisServer) -> None:
    with server.client() as client:
        for i in range(20):
            client.set(f"v:{i:02d}", bytes([i]) * (300 << 10))
        client.set("huge", b"0123456789abcdef" * (3 << 16))  # 3 MB
        client.rpush("list", b"a", b"b")
        client.mset({f"s:{i:03d}": f"small {i}" for i in range(200)})


def _limited(tmp_path: Path, servers: list[RedisServer]) -> Config:
    data = {
        "settings": {"store": str(tmp_path / "s.sqlite"), "repair_settle": "10ms",
                     "max_reply_bytes": "1MB"},
        "groups": [{"name": "g", "members": [
            {"name": f"m{i}", "url": f"redis://127.0.0.1:{s.port}"} for i, s in enumerate(servers)
        ]}],
    }  # fmt: skip
    return config_from_dict(data, where="test")


async def test_check_and_repair_under_a_low_reply_limit(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    servers = [redis_factory("a"), redis_factory("b")]
    for server in servers:
        _fill(server)
    with servers[0].client() as client:
        client.set("grown", "small here")
    with servers[1].client() as client:
        client.set("v:07", b"x" * (300 << 10))
        client.set("s:010", "changed")
        client.delete("s:020")
        client.setrange("huge", 2 << 20, b"X")
        client.set("grown", b"g" * (3 << 20))
    config = _limited(tmp_path, servers)
    assert all(ep.limits.max_bytes == 1 << 20 for ep in config.topology.endpoints())
    # The check compares every key, the 3 MB strings too (read in pages on both replicas).
    found = (await check(config, group="g")).to_dict()
    divergent = ["grown", "huge", "s:010", "s:020", "v:07"]
    assert sorted(k["key"] for k in found["divergent_keys"]) == divergent
    # The 3 MB string is copied in GETRANGE/APPEND pages (under the paged copy's guard);
    # one that m0's small value would replace on m1 cannot be kept aside by its DUMP for
    # an undo: that key's own error, the run goes on.
    fixed = (await repair(config, group="g", policy="source:m0")).to_dict()
    status = {k["key"]: k["status"] for k in fixed["divergent_keys"]}
    assert status == dict.fromkeys(divergent, "repaired") | {"grown": "error"}
    (grown,) = [k for k in fixed["divergent_keys"] if k["key"] == "grown"]
    assert grown["reason"] == (
        "m1 refused: b'grown' is a string of 3145728 bytes: its DUMP would pass max_reply_bytes"
        " = 1 MB; not repaired (a value this big is copied only with a higher max_reply_bytes)"
    )
    left = (await check(config, group="g")).to_dict()
    assert [k["key"] for k in left["divergent_keys"]] == ["grown"]
    with servers[0].client() as a, servers[1].client() as b:
        assert a.get("huge") == b.get("huge") and b.keys("replag:*") == []


async def test_a_hash_of_big_fields_is_read_in_pages_that_fit(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    # 2000 fields of 5 KB: a page of 1000 (the default chunk) would be 5 MB.
    servers = [redis_factory("a"), redis_factory("b")]
    fields = {f"f{i:04d}": bytes([i % 251]) * 5000 for i in range(2000)}
    for server in servers:
        with server.client() as client:
            client.hset("wide", mapping=fields)
            client.rpush("long", *[b"x" * 5000] * 600)
    with servers[1].client() as client:
        client.hset("wide", "f0100", "changed")
        client.lset("long", 599, "changed")
    config = _limited(tmp_path, servers)
    found = (await check(config, group="g")).to_dict()
    assert sorted(k["key"] for k in found["divergent_keys"]) == ["long", "wide"]
    fixed = (await repair(config, group="g", policy="source:m0")).to_dict()
    assert {k["key"]: k["status"] for k in fixed["divergent_keys"]} == {
        "long": "repaired",
        "wide": "repaired",
    }


def test_the_async_scanner_under_a_low_reply_limit_indexes_what_it_indexes_without(
    big: RedisServer,
) -> None:
    endpoint = Endpoint.from_url(big.url, name="big")
    expected = BlockingScan(endpoint, ScanOptions(count=1000)).run(ScanProgress("big"))
    endpoint = dataclasses.replace(endpoint, limits=LIMIT)
    state = ScanProgress("big")
    got = asyncio.run(ReplicaScanner(endpoint, ScanOptions(count=1000)).run(state))
    assert entries(got) == entries(expected)
    assert state.finished and state.keys == len(got) == 20 + 1 + 1 + 200


def test_read_values_reads_a_string_over_the_limit_in_pages(
    big: RedisServer,
) -> None:
    endpoint = dataclasses.replace(Endpoint.from_url(big.url, name="big"), limits=LIMIT)

    async def read() -> ReadValue | None:
        conn = await RespConnection.open(endpoint, timeout_s=5)
        try:
            return (await read_values(conn, [(b"huge", "string")], keep=True))[b"huge"]
        finally:
            await conn.close()

    value = b"0123456789abcdef" * (3 << 16)
    assert asyncio.run(read()) == ReadValue("string", string_digest(value), value)
