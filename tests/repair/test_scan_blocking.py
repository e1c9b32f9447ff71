"""The scan processes' blocking loop: the same index as `ReplicaScanner`, the same errors.

Run outside an event loop, as in a scan process (it runs one of its own for keys
of other types)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from replag.errors import AuthError, UnreachableError
from replag.repair.scan.blocking import REPLY_BUDGET, BlockingScan
from replag.repair.scan.scanner import (
    ReplicaScanner,
    ScanIndex,
    ScanOptions,
    ScanProgress,
    without_prefix,
)
from replag.topology import Endpoint
from replag.wire.resp import pack, pack_over_keys
from replag.wire.resp_blocking import BlockingConnection
from tests.helpers.keyspace import fill, write_every_type
from tests.helpers.redis_servers import RedisFactory


def entries(index: ScanIndex) -> list[tuple[bytes, int, int]]:
    return sorted(
        (index.key(i), int(index.key_hashes[i]), int(index.entries[i])) for i in range(len(index))
    )


@pytest.mark.parametrize("ttls", ["auto", "pttl", "script", "none"])
def test_the_blocking_scan_indexes_exactly_what_the_async_scanner_does(
    redis_factory: RedisFactory, ttls: str
) -> None:
    server = redis_factory("same")
    with server.client() as client:
        fill(client, 2500)
        write_every_type(client)
        # Mid-bucket expiries: the two scans' reading of them cannot straddle a bucket edge.
        at = (int(time.time() * 1000) // 2000 + 1800) * 2000 + 1000
        for i in range(0, 2500, 9):
            client.pexpireat(f"k:{i:07d}", at)
        client.set("replag:probe:x", "in flight")  # excluded, as probe keys are
    endpoint = Endpoint.from_url(server.url, name="n")
    options = ScanOptions(count=300, exclude_prefix=b"replag:probe:", ttls=ttls, ttl_bucket_ms=2000)  # type: ignore[arg-type]
    state = ScanProgress("n")
    blocking = BlockingScan(endpoint, options)
    got = blocking.run(state)
    expected = asyncio.run(ReplicaScanner(endpoint, options).run(ScanProgress("n")))
    assert entries(got) == entries(expected)
    assert len(got) == 2500 + 7  # every key but the probe key: strings and every type
    assert state.finished and state.cursor == b"0" and state.keys == len(got)
    assert blocking.ttl_source == ("pttl" if ttls == "auto" else ttls)
    assert blocking.bytes_received > 2500 * 64


def test_large_values_are_read_in_smaller_batches_with_the_same_index(
    redis_factory: RedisFactory,
) -> None:
    server = redis_factory("large")
    value = b"v" * 8192
    with server.client() as client:
        pipe = client.pipeline(transaction=False)
        for i in range(2500):
            pipe.set(f"k:{i:07d}", value + str(i).encode())
        pipe.execute()
        # TTLs read too, as a default check does; mid-bucket, as in the test above.
        client.pexpireat("k:0000007", (int(time.time() * 1000) // 2000 + 1800) * 2000 + 1000)

        def scans() -> int:
            stats = client.info("commandstats").get("cmdstat_scan", {})
            return int(stats.get("calls", 0))

        before = scans()
        cursor = None
        while cursor != 0:  # what COUNT 400 throughout takes
            cursor, _ = client.scan(cursor or 0, count=400)
        at_400 = scans() - before
        endpoint = Endpoint.from_url(server.url, name="n")
        options = ScanOptions(count=400, ttl_bucket_ms=2000)
        before = scans()
        got = BlockingScan(endpoint, options).run(ScanProgress("n"))
        calls = scans() - before
    expected = asyncio.run(ReplicaScanner(endpoint, options).run(ScanProgress("n")))
    assert entries(got) == entries(expected) and len(got) == 2500
    # Replies held near REPLY_BUDGET (about 30 of these keys), at least 100 keys a batch:
    # 100 once the first batch told their size (three SCANs go out before), not 400.
    assert REPLY_BUDGET // len(value) < 100 and calls >= 2 * at_400, (calls, at_400)


def test_keys_of_other_types_are_read_together_not_one_batch_at_a_time(
    redis_factory: RedisFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = redis_factory("others")
    with server.client() as client:
        fill(client, 4000)
        pipe = client.pipeline(transaction=False)
        for i in range(0, 4000, 8):  # 500 hashes among the strings: in almost every batch
            pipe.delete(f"k:{i:07d}")
            pipe.hset(f"k:{i:07d}", mapping={"f": str(i), "g": "x"})
        for i in range(3, 4000, 400):  # and a few expiring ones
            pipe.pexpire(f"k:{i:07d}", 3_600_000)
        pipe.execute()
    endpoint = Endpoint.from_url(server.url, name="n")
    options = ScanOptions(count=200, ttl_bucket_ms=3_600_000)
    flushed: list[int] = []
    real = BlockingScan._index_values

    async def counted(self: BlockingScan, keys: list[bytes], *rest: object) -> ScanIndex:
        flushed.append(len(keys))
        return await real(self, keys, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(BlockingScan, "_index_values", counted)
    state = ScanProgress("n")
    got = BlockingScan(endpoint, options).run(state)
    expected = asyncio.run(ReplicaScanner(endpoint, options).run(ScanProgress("n")))
    assert entries(got) == entries(expected) and len(got) == 4000 == state.keys
    # ~20 batches hold hashes; they are read 200 at a time (plus the rest at the end).
    assert sum(flushed) == 500 and len(flushed) <= 4
    assert all(n >= 200 for n in flushed[:-1])


def test_a_resumed_blocking_scan_adds_up_to_a_whole_one(redis_factory: RedisFactory) -> None:
    server = redis_factory("resume")
    with server.client() as client:
        fill(client, 3000)
        for i in range(0, 3000, 7):  # keys of other types, read later than their batch
            client.delete(f"k:{i:07d}")
            client.sadd(f"k:{i:07d}", "a", "b")
    endpoint = Endpoint.from_url(server.url, name="n")
    options = ScanOptions(count=200, checkpoint_every_s=0.0)
    saved: list[ScanProgress] = []

    def checkpoint(state: ScanProgress) -> None:
        if not state.finished and state.keys and not saved:
            saved.append(ScanProgress(**vars(state)))

    whole = BlockingScan(endpoint, options, checkpoint=checkpoint).run(ScanProgress("n"))
    before = saved[0].keys  # the resumed scan counts on from there
    assert 0 < before < 3000 and len(whole) == 3000
    rest = BlockingScan(endpoint, options).run(saved[0])
    # The checkpoint's keys, then the rest from its cursor: every key (SCAN may repeat one).
    assert {k for k, _, _ in entries(rest)} | set(map(whole.key, range(before))) == {
        k for k, _, _ in entries(whole)
    }


def test_a_refused_password_is_one_auth_error(redis_factory: RedisFactory) -> None:
    server = redis_factory("auth", password="s3cret-pw")
    endpoint = Endpoint.from_url(f"redis://:wrong-pw@127.0.0.1:{server.port}", name="n")
    with pytest.raises(AuthError) as raised:
        BlockingConnection.open(endpoint, timeout_s=5)
    assert "127.0.0.1" in str(raised.value) and "wrong-pw" not in str(raised.value)
    good = Endpoint.from_url(f"redis://:s3cret-pw@127.0.0.1:{server.port}/2", name="n")
    conn = BlockingConnection.open(good, timeout_s=5)
    assert conn.request(b"*1\r\n$4\r\nPING\r\n", 1) == [b"PONG"]
    conn.close()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listener that accepts and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for s in accepted:
        s.close()
    listener.close()


def test_a_server_that_never_answers_times_out_naming_it(silent_port: int) -> None:
    endpoint = Endpoint.from_url(f"redis://127.0.0.1:{silent_port}", name="mute")
    options = ScanOptions(timeout_s=0.3)
    with pytest.raises(UnreachableError) as raised:
        BlockingScan(endpoint, options).run(ScanProgress("mute"))
    assert "timed out" in str(raised.value) and f"127.0.0.1:{silent_port}" in str(raised.value)


def test_a_closed_port_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = Endpoint.from_url(f"redis://127.0.0.1:{port}", name="gone")
    with pytest.raises(UnreachableError) as raised:
        BlockingScan(endpoint, ScanOptions(timeout_s=2)).run(ScanProgress("gone"))
    assert f"127.0.0.1:{port}" in str(raised.value)


@pytest.mark.parametrize(
    "keys",
    [
        [b"k:%07d" % i for i in range(50)],  # one length: the join path
        [b"a", b"bb", b"", b"\r\n$3\r\n", b"\xff\x00" * 300],  # mixed, binary: through hiredis
        [b"only"],
    ],
)
def test_keys_are_packed_as_hiredis_packs_each_command(keys: list[bytes]) -> None:
    heads = ((b"MGET",), (b"EVALSHA", b"f" * 40, len(keys)))
    assert pack_over_keys(keys, *heads) == pack(b"MGET", *keys) + pack(*heads[1], *keys)


def test_probe_keys_are_left_out_wherever_they_are_in_a_batch() -> None:
    prefix = b"replag:probe:"
    assert without_prefix([b"a", b"replag:probe:1", b"b"], prefix) == [b"a", b"b"]
    assert without_prefix([b"replag:probe:1", b"b"], prefix) == [b"b"]
    # A key holding the prefix after a newline is no probe key.
    assert without_prefix([b"x\nreplag:probe:", b"y"], prefix) == [b"x\nreplag:probe:", b"y"]
    assert without_prefix([b"a", b"b"], None) == [b"a", b"b"]
