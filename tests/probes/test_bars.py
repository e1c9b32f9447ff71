"""Error bars that hold when the prober's event loop is held: checked against the servers'
own MONITOR stamps (the truth `benchmarks/probe_accuracy.py` scores against), and the
bracket arithmetic of arrivals the kernel did not stamp."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from replag.config import load_config
from replag.probes import run_probe
from replag.probes.cpu_wait import CpuWait, local_server
from replag.probes.observers import ONE_WAY_FLOOR_NS, PushObserver, server_pid
from replag.topology import Endpoint
from replag.wire.resp import RespConnection
from replag.wire.stamped_socket import ReadStamp
from tests.helpers.lab import LabFactory
from tests.helpers.redis_servers import RedisFactory

# "1795698143.992190 [0 127.0.0.1:17001] "SET" "key" ..." (a status reply: leading "+").
MONITOR_SET = re.compile(rb'^\+?(\d+)\.(\d{6}) \[\d+ [^\]]*\] "set" "([^"]+)"', re.IGNORECASE)
HOLD_S = 0.02


@contextmanager
def monitor(port: int) -> Iterator[bytearray]:
    """MONITOR on a server, read by a thread into the yielded buffer until the block ends."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"MONITOR\r\n")
    seen = bytearray(sock.recv(64))
    assert seen.startswith(b"+OK"), seen

    def read() -> None:
        while chunk := sock.recv(1 << 16):
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        time.sleep(0.2)  # the last SETs' lines are on their way
        sock.shutdown(socket.SHUT_RDWR)
        reader.join(10)
        sock.close()


def executed_us(log: bytes, prefix: bytes) -> dict[str, int]:
    """Key → the server's own µs time it executed the first SET of it."""
    out: dict[str, int] = {}
    for line in log.splitlines():
        match = MONITOR_SET.match(line)
        if match and match[3].startswith(prefix):
            out.setdefault(match[3].decode(), int(match[1]) * 1_000_000 + int(match[2]))
    return out


async def test_samples_stamped_while_the_loop_was_held_keep_bars_that_hold_the_truth(
    lab_factory: LabFactory,
) -> None:
    state = lab_factory(regions=("near", "far"), delays_ms={"far": 1})
    ports = {p["name"]: p["port"] for p in state["processes"]}
    config = load_config(Path(state["dir"]) / "topology.toml")
    held_after: list[int] = []  # the writes after which the loop was held

    def hold_now_and_then() -> None:
        # Called before each write: every 5th time, the event loop is blocked on purpose
        # for 20 ms while the previous write's event arrives (the writes go back to back).
        held_after.append(len(held_after) - 1)
        if len(held_after) % 5 == 0:
            time.sleep(HOLD_S)

    with monitor(ports["near-primary"]) as primary, monitor(ports["far-1"]) as replica:
        report = await run_probe(
            config, count=60, rate=0, mode="push", timeout_s=10, fence=hold_now_and_then
        )
    prefix = config.settings.prefix.encode()
    on_primary = executed_us(bytes(primary), prefix)
    on_replica = executed_us(bytes(replica), prefix)
    held = {seq for n, seq in enumerate(held_after, 1) if n % 5 == 0 and seq >= 0}
    assert len(held) >= 10
    samples = {s.seq: s for s in report.samples if s.replica == "far-1" and s.seq in held}
    assert set(samples) == held
    for seq, sample in samples.items():
        key = sample.key
        assert key == f"{config.settings.prefix}{report.run_id}:{seq}"
        # Not dropped (none is): every held sample was seen, with a bar.
        assert sample.lag_ns is not None and sample.stamp, sample
        truth_ns = (on_replica[key] - on_primary[key]) * 1000
        # MONITOR stamps are whole µs, each truncated: the truth is known to ±1 µs.
        off = abs(sample.lag_ns - truth_ns) - 1000
        assert off <= sample.uncertainty_ns, (sample, truth_ns)


def test_an_event_the_kernel_did_not_stamp_is_bracketed_from_the_read_before() -> None:
    """Stamped when read (TLS, or no kernel stamp): it reached us after the previous read
    began and by this one, however late this one came; the estimate stays the read."""
    observer = PushObserver(
        Endpoint.from_url("redis://127.0.0.1:1", name="r"), pattern=b"k*", rtt_ns=0, timeout_s=5
    )
    us = 1000
    read_at, since = 50_000 * us, 30_000 * us  # the loop was held 20 ms before this read
    observer.on_event(b"__keyspace@0__:k1", read_at, read_at, ReadStamp(read_at, since, False))
    arrival = observer.arrivals[b"k1"]
    assert (arrival.lo_ns, arrival.hi_ns) == (since - ONE_WAY_FLOOR_NS, read_at)
    assert arrival.estimate_ns == read_at and arrival.stamp == "loop"
    assert arrival.error_bound_ns == read_at - since + ONE_WAY_FLOOR_NS
    # A kernel stamp's conversion error (half its clock sandwich) widens both ends.
    stamped = ReadStamp(read_at, since, True, error_ns=7 * us)
    observer.on_event(b"__keyspace@0__:k2", read_at - 19_000 * us, read_at - 19_000 * us, stamped)
    exact = observer.arrivals[b"k2"]
    assert exact.hi_ns == read_at - 19_000 * us + 7 * us
    assert exact.lo_ns == read_at - 19_000 * us - ONE_WAY_FLOOR_NS - 7 * us
    assert exact.stamp == "kernel"


def test_a_bar_widens_by_the_prober_s_own_wait_for_a_cpu_around_the_arrival() -> None:
    """This thread's run-queue wait and scheduling count, sampled every ms: an arrival's
    widening is the mean wait per scheduling within 10 ms either side of it."""
    ms = 1_000_000
    waits = CpuWait()
    # Scheduled once a ms throughout; from 30 ms to 50 ms each wait 0.4 ms, 1 µs before.
    waited = 0
    for t in range(0, 81):
        waited += 400_000 if 30 <= t < 50 else 1000
        waits.record(t * ms, waited, t)
    assert 350_000 < waits.around(40 * ms) <= 400_000  # the window is (about) the busy stretch
    assert 1000 < waits.around(25 * ms) < 400_000  # half in it
    assert waits.around(70 * ms) == 0  # quiet: µs waits are a wakeup's cost, not applied
    assert CpuWait().around(10 * ms) == 0  # nothing sampled: unknown


async def test_a_replica_on_this_host_is_found_and_its_cpu_wait_bounds_the_bar(
    redis_factory: RedisFactory,
) -> None:
    server = redis_factory("bars")
    endpoint = Endpoint.from_url(server.url, name="r")
    conn = await RespConnection.open(endpoint, timeout_s=5)
    try:
        pid = await server_pid(conn)
    finally:
        await conn.close()
    assert pid is not None
    found = local_server(pid, server.port)
    assert found == f"/proc/{pid}/schedstat"
    assert local_server(pid, server.port + 1) is None  # another port: not that server
    assert local_server(os.getpid(), server.port) is None  # not a Redis server
    waits = CpuWait(found)
    assert waits.sees_replica
    waits.note(1_000)  # reads it
    # The replica's wait between a sample at or before the window and one after the
    # arrival: here it waited 3 ms between 2 and 3 ms (counted when it ran again).
    ms = 1_000_000
    for t, waited in enumerate([0, 0, 0, 3 * ms, 3 * ms, 3 * ms], start=1):
        waits.record(t * ms + 1_000, 0, 0, replica_waited_ns=waited)
    waits.close()
    assert waits.replica_waited(3 * ms + 1_000, 4 * ms) == 3 * ms
    assert waits.replica_waited(4 * ms + 1_000, 5 * ms) == 0
    assert waits.replica_waited(0, 5 * ms) is None  # no sample that early
    assert CpuWait().replica_waited(0, ms) is None  # no replica seen
