"""`RespConnection` against a real redis-server: pushed messages (the probe's push observer)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Any

import pytest

from replag.errors import PermissionRefused, ReplagError
from replag.probes.observers import PushObserver
from replag.topology import Endpoint
from replag.wire.resp import RespConnection
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.waiting import until


async def test_pushed_messages_go_to_on_push_and_replies_still_answer(
    redis_factory: RedisFactory,
) -> None:
    server = redis_factory("push")
    pushed: list[tuple[list[Any], int]] = []
    conn = await RespConnection.open(
        Endpoint.from_url(server.url, name="push"),
        timeout_s=5,
        clock=time.monotonic_ns,
        on_push=lambda message, arrived, _: pushed.append((message, arrived)),
    )
    try:
        assert await conn.checked(b"PSUBSCRIBE", b"ch:*") == [b"psubscribe", b"ch:*", 1]
        with server.client() as client:
            before = time.monotonic_ns()
            for i in range(3):
                client.publish(f"ch:{i}", f"m{i}")
        await until(lambda: len(pushed) == 3, "three pushed messages")
        assert [m for m, _ in pushed] == [[b"pmessage", b"ch:*", b"ch:%d" % i, b"m%d" % i]
                                          for i in range(3)]  # fmt: skip
        assert all(arrived >= before for _, arrived in pushed)  # stamped on the given clock
        assert await conn.checked(b"PING") == [b"pong", b""]  # a reply, not a push
    finally:
        await conn.close()


async def test_the_push_observer_notices_its_connection_closing(
    redis_factory: RedisFactory,
) -> None:
    server = redis_factory("push", extra_args=("--notify-keyspace-events", "K$"))
    observer = PushObserver(
        Endpoint.from_url(server.url, name="r1"), pattern=b"p:*", rtt_ns=1000, timeout_s=5
    )
    await observer.start()
    try:
        with server.client() as client:
            client.set("p:1", "x")
            await until(lambda: b"p:1" in observer.arrivals, "the keyspace event of p:1")
            assert observer.error is None
            client.client_kill_filter(_type="pubsub")
        await until(lambda: observer.error is not None, "the closed connection noticed")
        assert observer.error == "push connection closed: by the server"
    finally:
        await observer.stop()


async def test_a_refused_subscription_names_the_replica(redis_factory: RedisFactory) -> None:
    server = redis_factory("acl")
    with server.client() as client:
        client.config_set("notify-keyspace-events", "K$")
        # A user allowed every key and command but no channel, as on managed services.
        client.acl_setuser("probe", enabled=True, passwords=["+s3cret"], keys=["*"],
                           commands=["+@all"], reset_channels=True)  # fmt: skip
    url = f"redis://probe:s3cret@127.0.0.1:{server.port}"
    observer = PushObserver(Endpoint.from_url(url, name="r1"), pattern=b"*", rtt_ns=0, timeout_s=5)
    with pytest.raises(PermissionRefused, match="push subscription failed") as raised:
        await observer.start()
    # A permission refusal, not an authentication failure: the user did log in.
    assert "permission refused: PSUBSCRIBE (user probe)" in str(raised.value)
    assert "authentication" not in str(raised.value)
    assert raised.value.where is not None and raised.value.where.startswith("r1 (")
    assert "s3cret" not in str(raised.value)
    assert observer.conn is not None and observer.conn.endpoint.name == "r1"
    await asyncio.wait_for(observer.conn.wait_closed(), 5)  # closed, not leaked


async def test_a_server_that_hangs_up_at_once_is_an_endpoint_error_every_time() -> None:
    """A peer closing right after accepting (a partitioned relay link does) races our first
    command: whether the close or the write is seen first, the caller gets a ReplagError
    naming the endpoint, never a bare ConnectionResetError, and no future is left behind."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def hang_up() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                client, _ = server.accept()
                client.close()

    threading.Thread(target=hang_up, daemon=True).start()
    endpoint = Endpoint.from_url(f"redis://127.0.0.1:{port}", name="hangs-up")
    try:
        for attempt in range(60):
            with pytest.raises(ReplagError) as info:
                conn = await RespConnection.open(endpoint, timeout_s=5, clock=time.monotonic_ns)
                for _ in range(attempt % 4):  # let the loop see the close first, or not
                    await asyncio.sleep(0)
                time.sleep(0.0005)  # noqa: ASYNC251 (blocks the loop: the FIN is in, unread)
                await conn.checked(b"PING")
            assert "hangs-up" in str(info.value)
    finally:
        stop.set()
        server.close()


async def test_a_hung_server_is_a_timeout_for_every_request_not_a_closed_connection(
    redis_factory: RedisFactory,
) -> None:
    """A stopped server still accepts connections (the kernel does) but never answers:
    every request waiting on the connection says it timed out."""
    import os
    import signal

    from replag.errors import UnreachableError

    server = redis_factory("hung")
    conn = await RespConnection.open(
        Endpoint.from_url(f"redis://127.0.0.1:{server.port}", name="h"), timeout_s=0.5
    )
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        first = conn.send(b"*1\r\n$4\r\nPING\r\n", 1)
        second = conn.send(b"*1\r\n$4\r\nPING\r\n", 1)
        with pytest.raises(UnreachableError) as caught:
            await conn.wait(first)
        assert "timed out" in str(caught.value) and "closed" not in str(caught.value)
        with pytest.raises(UnreachableError) as later:
            await conn.wait(second)
        assert "timed out" in str(later.value) and "closed" not in str(later.value)
        with pytest.raises(UnreachableError, match="timed out"):
            conn.send(b"*1\r\n$4\r\nPING\r\n", 1)
    finally:
        os.kill(server.pid, signal.SIGCONT)
