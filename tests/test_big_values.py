"""Values bigger than max_reply_bytes allows in one reply (issue 33): a scan's batch
whose reply is refused is read again in halves, and a string longer than the limit is
hashed in GETRANGE pages, so the scan gives the index it gives under the default limit."""

from __future__ import annotations

import pytest

from replag import reply_limits
from replag.repair.scan.blocking import BlockingScan
from replag.repair.scan.scanner import ScanIndex, ScanOptions, ScanProgress
from replag.reply_limits import ReplyLimits
from replag.topology import Endpoint
from tests.helpers.redis_servers import RedisFactory, RedisServer

LIMIT = ReplyLimits(max_bytes=1 << 20)


@pytest.fixture
def big(redis_factory: RedisFactory) -> RedisServer:
    server = redis_factory("big")
    with server.client() as client:
        for i in range(20):
            client.set(f"v:{i:02d}", bytes([i]) * (300 << 10))
        client.set("huge", b"0123456789abcdef" * (3 << 16))  # 3 MB
        client.pexpire("v:03", 3_600_000)
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
    before = reply_limits.current()
    reply_limits.configure(LIMIT)
    try:
        scan = BlockingScan(endpoint, ScanOptions(count=1000, reply_limits=LIMIT))
        state = ScanProgress("big")
        got = scan.run(state)
    finally:
        reply_limits.configure(before)
    assert entries(got) == entries(expected)
    assert len(got) == 20 + 1 + 1 + 200
    assert state.finished and state.cursor == b"0"
    assert scan._big_strings == 1  # "huge", in pages; the 300 KB values in smaller batches
