"""Kernel receive timestamps: bytes read late by a busy event loop keep their arrival time."""

from __future__ import annotations

import select
import time
from typing import Any

import pytest

from replag.probes.observers import ONE_WAY_FLOOR_NS, PROMPT_READ_NS, PushObserver
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, _Protocol, pack
from replag.wire.stamped_socket import (
    StampedSocket,
    clock_offset,
    connect_stamped,
    kernel_stamps_possible,
)
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.waiting import until

needs_stamps = pytest.mark.skipif(
    not kernel_stamps_possible(), reason="SO_TIMESTAMPNS is only used on Linux (generic numbers)"
)


class Recorder:
    def __init__(self) -> None:
        self.chunks: list[tuple[bytes, int, int]] = []
        self.lost: list[Exception | None] = []

    def received(self, data: bytes, arrived: int, since: int) -> None:
        self.chunks.append((data, arrived, since))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


def block_until_readable(sock: StampedSocket) -> None:
    """Hold the event loop (as a busy host would) until the reply is in the kernel."""
    select.select([sock.fileno()], [], [], 10)


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)


def test_a_preempted_clock_sandwich_is_read_again() -> None:
    # The second reading of the clock is held 20 ms, as a preemption inside the first
    # sandwich would: its midpoint would move every stamp by 10 ms. The next sandwich
    # is narrow and is the one used.
    calls = 0

    def preempted_once() -> int:
        nonlocal calls
        calls += 1
        if calls == 2:
            time.sleep(0.02)
        return time.monotonic_ns()

    def sandwich() -> tuple[int, int]:
        first = time.monotonic_ns()
        wall = time.time_ns()
        second = time.monotonic_ns()
        return second - first, (first + second) // 2 - wall

    offset = clock_offset(preempted_once)
    _, truth = min(sandwich() for _ in range(50))  # the narrowest of many
    assert abs(offset - truth) < 2_000_000  # within 2 ms, not 10
    assert calls > 2


@needs_stamps
async def test_a_reply_read_late_carries_the_moment_it_arrived(redis_factory: RedisFactory) -> None:
    server = redis_factory("stamps")
    recorder = Recorder()
    sock = await connect_stamped("127.0.0.1", server.port, recorder, time.monotonic_ns)
    try:
        assert sock.kernel_stamps
        sent = time.monotonic_ns()
        sock.write(pack(b"PING"))
        block_until_readable(sock)
        seen_readable = time.monotonic_ns()
        hold_the_loop(0.05)  # still held: a stamp taken when read would come after this
        held_until = time.monotonic_ns()
        await until(lambda: bool(recorder.chunks), "the PONG")
        data, arrived, since = recorder.chunks[0]
        assert data == b"+PONG\r\n"
        # Arrival on the monotonic clock: after the send, before we saw it was there.
        assert sent < arrived <= seen_readable < held_until
        assert since <= sent  # nothing had been read since connecting
    finally:
        sock.close()
    await until(lambda: recorder.lost == [None], "the connection closed")


@needs_stamps
async def test_wall_clock_connections_get_the_kernel_stamp_unconverted(
    redis_factory: RedisFactory,
) -> None:
    server = redis_factory("stamps")
    recorder = Recorder()
    sock = await connect_stamped("127.0.0.1", server.port, recorder, time.time_ns)
    try:
        sent = time.time_ns()
        sock.write(pack(b"PING"))
        block_until_readable(sock)
        seen_readable = time.time_ns()
        await until(lambda: bool(recorder.chunks), "the PONG")
        assert sent < recorder.chunks[0][1] <= seen_readable
    finally:
        sock.abort()


async def test_a_closed_server_connection_is_reported_lost(redis_factory: RedisFactory) -> None:
    server = redis_factory("stamps")
    recorder = Recorder()
    sock = await connect_stamped("127.0.0.1", server.port, recorder, time.monotonic_ns)
    sock.write(pack(b"QUIT"))
    await until(lambda: bool(recorder.lost), "the server closing the connection")
    assert recorder.lost == [None] and sock.is_closing()
    assert [data for data, _, _ in recorder.chunks] == [b"+OK\r\n"]
    sock.write(pack(b"PING"))  # dropped, as asyncio's transports do once closed
    assert recorder.lost == [None] and len(recorder.chunks) == 1


async def test_a_large_write_is_sent_whole(redis_factory: RedisFactory) -> None:
    # Bigger than a socket buffer: the rest goes out when the socket drains.
    server = redis_factory("stamps")
    conn = await RespConnection.open(Endpoint.from_url(server.url, name="s"), timeout_s=10)
    try:
        value = b"v" * (8 << 20)
        assert await conn.request(pack(b"SET", b"big", value) + pack(b"STRLEN", b"big"), 2) == [
            b"OK",
            8 << 20,
        ]
        assert conn.kernel_stamps == kernel_stamps_possible()
    finally:
        await conn.close()


async def test_messages_read_together_get_a_bracket_only_the_last_is_exact() -> None:
    pushed: list[tuple[bytes, bytes, int, int]] = []

    def on_push(message: list[Any], arrived: int, earliest: int) -> None:
        pushed.append((message[2], message[3], arrived, earliest))

    protocol = _Protocol(time.monotonic_ns, on_push)

    def event(key: bytes, kind: bytes) -> bytes:
        return pack(b"pmessage", b"__keyspace@0__:*", b"__keyspace@0__:" + key, kind)

    # Two writes' events read in one chunk whose last packet arrived at 1000; the read
    # before began at 400. The first may have arrived any time in between.
    protocol.received(event(b"a", b"set") + event(b"b", b"set"), 1000, 400)
    assert [(k[-1:], a, e) for k, _, a, e in pushed] == [(b"a", 1000, 400), (b"b", 1000, 1000)]
    # One SET … PX: its set and expire events are written together, both exact.
    pushed.clear()
    protocol.received(event(b"c", b"set") + event(b"c", b"expire"), 1500, 1100)
    assert [(kind, a, e) for _, kind, a, e in pushed] == [
        (b"set", 1500, 1500),
        (b"expire", 1500, 1500),
    ]
    # A message followed by part of the next did not end the last packet; the next,
    # completed by the following chunk, did.
    pushed.clear()
    second = event(b"e", b"set")
    protocol.received(event(b"d", b"set") + second[:9], 2000, 1600)
    protocol.received(second[9:], 2600, 2100)
    assert [(k[-1:], a, e) for k, _, a, e in pushed] == [(b"d", 2000, 1600), (b"e", 2600, 2600)]


def test_the_push_observer_turns_a_bracket_into_an_honest_arrival() -> None:
    """An exact event is placed half the smallest PING round trip before it reached us,
    its bracket reaching back the largest; a chunk read late is bracketed from the read
    before and placed in the middle (`within_chunks` places it better); one read at once
    after its last packet keeps the chunk's arrival (its events arrived together)."""
    us = 1000
    observer = PushObserver(
        Endpoint.from_url("redis://127.0.0.1:1", name="r"),
        pattern=b"*",
        rtt_ns=40 * us,
        rtt_max_ns=300 * us,
        timeout_s=1,
    )
    now = time.monotonic_ns()
    observer.clock = lambda: now  # every event handled at `now`, however slow the host
    late = now - 10 * PROMPT_READ_NS
    observer.on_event(b"__keyspace@0__:exact", now, now)
    observer.on_event(b"__keyspace@0__:late", late, late - 5000 * us)
    observer.on_event(b"__keyspace@0__:prompt", now, now - 5000 * us)
    exact, late_one, prompt = (observer.arrivals[k] for k in (b"exact", b"late", b"prompt"))
    assert (exact.estimate_ns, exact.lo_ns, exact.hi_ns) == (now - 20 * us, now - 300 * us, now)
    assert not exact.merged and not exact.prompt
    assert (late_one.estimate_ns, late_one.lo_ns, late_one.hi_ns) == (
        late - 2500 * us - 20 * us,
        late - 5300 * us,
        late,
    )
    assert late_one.merged and not late_one.prompt
    assert (prompt.estimate_ns, prompt.lo_ns) == (now - 20 * us, now - 5300 * us)
    assert prompt.merged and prompt.prompt
    # However fast the PINGs were, an event's trip is bounded by no less than the floor.
    quick = PushObserver(
        Endpoint.from_url("redis://127.0.0.1:1", name="r"),
        pattern=b"*",
        rtt_ns=10 * us,
        timeout_s=1,
    )
    quick.on_event(b"__keyspace@0__:k", now, now)
    assert quick.arrivals[b"k"].lo_ns == now - ONE_WAY_FLOOR_NS


async def test_probe_connections_stamp_in_the_kernel(redis_factory: RedisFactory) -> None:
    server = redis_factory("stamps")
    conn = await RespConnection.open(
        Endpoint.from_url(server.url, name="s"), timeout_s=5, clock=time.monotonic_ns
    )
    try:
        assert conn.kernel_stamps == kernel_stamps_possible()
        _, sent, arrived = await conn.call(b"PING")
        assert sent < arrived <= time.monotonic_ns()
    finally:
        await conn.close()
