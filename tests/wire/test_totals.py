"""Totals, not only single replies: bytes no request asked for (max_unrequested_bytes),
INFO's size and lines (max_info_bytes, max_info_lines). Each refusal is one error
naming the server and the setting."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time

import pytest

from replag.errors import EndpointError, ReplyShapeError
from replag.topology import Endpoint
from replag.wire.reply_limits import ReplyLimits
from replag.wire.resp import RespConnection
from tests.helpers.hostile import liar_answers
from tests.helpers.scripted import ScriptedServer, array, bulk


def _flooding_server() -> tuple[socket.socket, int, threading.Event]:
    """Answers the first command with +PONG, then floods +PONG for 3 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        sock, _ = listener.accept()
        with sock:
            sock.recv(1024)
            sock.sendall(b"+PONG\r\n")
            until = time.monotonic() + 3
            try:
                while time.monotonic() < until and not done.is_set():
                    sock.sendall(b"+PONG\r\n" * 8192)
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1], done


async def test_a_server_flooding_replies_nobody_asked_for_is_closed_and_named() -> None:
    listener, port, done = _flooding_server()
    limits = ReplyLimits(max_unrequested_bytes=1 << 16)
    endpoint = Endpoint(name="flood", host="127.0.0.1", port=port, limits=limits)
    try:
        conn = await RespConnection.open(endpoint, timeout_s=5)
        assert await conn.checked("PING") == b"PONG"
        await conn.wait_closed()  # closed by us, once the flood passed the limit
        with pytest.raises(EndpointError, match="max_unrequested_bytes = 65536 bytes") as err:
            await conn.checked("PING")
        assert "flood" in str(err.value)
        await conn.close()
    finally:
        done.set()
        listener.close()


@pytest.mark.parametrize(
    ("info", "setting"),
    [("a:b\r\n" * 5000, "max_info_lines = 1000"), ("x" * 200_000, "max_info_bytes = 100000")],
)
async def test_an_info_over_its_bounds_is_refused_naming_the_setting(
    info: str, setting: str
) -> None:
    with ScriptedServer({"INFO": bulk(info)}) as server:
        limits = ReplyLimits(max_info_bytes=100_000, max_info_lines=1000)
        endpoint = dataclasses.replace(
            Endpoint.from_url(f"redis://{server.address}", name="big-info"), limits=limits
        )
        conn = await RespConnection.open(endpoint, timeout_s=5)
        try:
            # Over max_info_bytes: refused at the door, as it streams (`reply_bounds`),
            # a server the run cannot use; over max_info_lines: once read, before parsing.
            refused = ReplyShapeError if "lines" in setting else EndpointError
            with pytest.raises(refused, match=setting) as err:
                await conn.checked("INFO", "replication")
        finally:
            await conn.close()
    assert "big-info" in str(err.value) and "INFO" in str(err.value)


def _cluster_shards(nodes: int) -> bytes:
    node = array(
        bulk("id"), bulk("0" * 40), bulk("ip"), bulk("10.0.0.1"), bulk("port"), b":7000\r\n"
    )
    shard = array(
        bulk("slots"), array(b":0\r\n", b":16383\r\n"), bulk("nodes"), array(*[node] * nodes)
    )
    return array(shard)


async def test_a_cluster_answer_naming_too_many_nodes_is_refused() -> None:
    from replag.discovery.cluster import read_shards

    answers = {
        "CLUSTER INFO": bulk("cluster_state:ok\r\n"),
        "CLUSTER SHARDS": _cluster_shards(20_000),
    }
    with ScriptedServer(answers) as server:
        seed = Endpoint.from_url(f"redis://{server.address}", name="fake")
        with pytest.raises(ReplyShapeError, match="20000 nodes, over max_topology_nodes = 10000"):
            await read_shards(seed, timeout_s=5)


def test_a_string_read_in_pages_ends_at_max_string_bytes() -> None:
    from replag.repair.keyspace.values import _Reader

    limits = ReplyLimits(max_bytes=16, max_string_bytes=64)
    reader = _Reader(b"s", "string", 10, False, limits)
    pages = 0
    while not reader.done:
        reader.command()
        reader.feed([b"x" * 8])  # always a full page: a server claiming an endless string
        pages += 1
        assert pages < 100
    assert reader.failed and reader.start == 64


async def test_discovery_asks_the_replicas_it_finds_at_once_under_one_deadline() -> None:
    """A primary naming 50 replicas where nothing answers: all asked at once, each
    written with why it is unread."""
    from replag.discovery.replication import discover_replication

    silent = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = silent.getsockname()[1]
    lines = "".join(f"slave{i}:ip=127.0.0.{i + 3},port={port},state=online,offset=0,lag=0\r\n"
                    for i in range(50))  # fmt: skip
    info = bulk("# Replication\r\nrole:master\r\nconnected_slaves:50\r\n" + lines)
    try:
        with ScriptedServer({"INFO": info}) as server:
            found = await discover_replication(f"redis://{server.address}", timeout_s=0.5)
    finally:
        silent.close()
    assert found.facts["replicas"] == 50
    text = "\n".join(found.endpoint_comments.values())
    assert text.count("could not be read") == 50


@pytest.mark.parametrize("scan", ["blocking", "async"])
def test_a_server_refused_on_every_batch_ends_the_scan_soon(scan: str) -> None:
    """Every batch refused and read again in pieces. The blocking scan reads it in halves:
    past max_reply_refusals the scan ends, naming the server, MGET and the setting. The
    async one reads it key by key, and so learns the values' lengths: once a few batches
    so refused held less than max_reply_bytes, the server lied and the scan ends. Either
    way after as many MGETs as the bound allows (not 2 per key of the keyspace)."""
    import asyncio

    from replag.repair.scan.blocking import BlockingScan
    from replag.repair.scan.scanner import ReplicaScanner, ScanOptions, ScanProgress
    from replag.wire.refusals import LIES_TOLERATED

    limits = ReplyLimits(max_reply_refusals=20)
    said = {
        "blocking": "21 replies to MGET refused at max_reply_bytes = 512 MB and read again in "
        "pieces, over max_reply_refusals = 20",
        "async": f"{LIES_TOLERATED + 1} replies to MGET refused at max_reply_bytes = 512 MB "
        "while their keys, read one by one, held at most",
    }[scan]
    with ScriptedServer(liar_answers(20_000)) as server:  # type: ignore[arg-type]
        endpoint = dataclasses.replace(
            Endpoint.from_url(f"redis://{server.address}", name="liar"), limits=limits
        )
        options = ScanOptions(timeout_s=5)
        with pytest.raises(EndpointError) as err:
            if scan == "blocking":
                BlockingScan(endpoint, options).run(ScanProgress("liar"))
            else:
                asyncio.run(ReplicaScanner(endpoint, options).run(ScanProgress("liar")))
        mgets = server.names().count("MGET")
    assert "liar" in str(err.value) and said in str(err.value), err.value
    # The bound; the async scan's walk ahead sends the next batches' MGETs meanwhile.
    assert mgets <= (21 if scan == "blocking" else 3 * (LIES_TOLERATED + 1)) + 2, mgets


def test_a_string_claimed_longer_than_max_string_bytes_ends_the_blocking_scan() -> None:
    """A single key whose MGET is refused is read in GETRANGE pages as long as STRLEN
    says: a STRLEN of 10^15 bytes ends the scan at once, naming the setting."""
    from replag.repair.scan.blocking import BlockingScan
    from replag.repair.scan.scanner import ScanOptions, ScanProgress

    with ScriptedServer(liar_answers(1, strlen=10**15)) as server:  # type: ignore[arg-type]
        endpoint = Endpoint.from_url(f"redis://{server.address}", name="claims")
        with pytest.raises(ReplyShapeError, match="max_string_bytes = 4096 MB") as err:
            BlockingScan(endpoint, ScanOptions(timeout_s=5)).run(ScanProgress("claims"))
        assert "GETRANGE" not in server.names()
    assert "STRLEN" in str(err.value) and "claims" in str(err.value)


async def test_replies_held_from_one_server_at_once_are_bounded_across_its_connections() -> None:
    """Each reply within max_reply_bytes, three connections' replies together past
    max_held_bytes: the one taking the total past it is refused, naming the setting; once
    they are closed, the server's account is back to nothing."""
    from replag.wire.held import held_from

    part = b"$3000000\r\n" + b"x" * 1_500_000  # half a reply of 3 MB, then silence
    with ScriptedServer({"GET": part}) as server:
        limits = ReplyLimits(max_bytes=4 << 20, max_held_bytes=4 << 20)
        endpoint = dataclasses.replace(
            Endpoint.from_url(f"redis://{server.address}", name="heavy"), limits=limits
        )
        conns = [await RespConnection.open(endpoint, timeout_s=5) for _ in range(3)]
        waits = [
            asyncio.ensure_future(c.request(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", 1)) for c in conns
        ]
        try:
            # Two connections hold 3 MB; the bytes of whichever comes third pass the limit.
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            with pytest.raises(EndpointError, match="over max_held_bytes = 4 MB") as err:
                done.pop().result()
            assert held_from(endpoint).total <= 4 << 20
        finally:
            for wait in waits:
                wait.cancel()
            for conn in conns:
                conn.abort()
            await asyncio.gather(*waits, return_exceptions=True)
            await asyncio.sleep(0.05)
    assert "heavy" in str(err.value) and "GET" in str(err.value)
    assert held_from(endpoint).total == 0
