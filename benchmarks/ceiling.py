"""The physical ceiling of a full read: every replica read completely, all at once.

One process per replica walks SCAN and fetches every batch with MGET on one
raw socket, replies parsed by hiredis and dropped: nothing a checker could
skip. The next SCAN and the MGET of the keys just returned go out together
before the previous MGET's reply is parsed, so the server never waits for
the client. The workers connect first and start together; the wall time is
from that start to the last one's end. Benchmarks call `measure_ceiling` in
the same run as the thing they compare to it, on the same servers.

With `ttls`, each batch's TTLs are fetched too, in the same write as its MGET, by
one of the exact ways a user could write without replag (none of replag's code):

- `pttl`: one pipelined PTTL per key;
- `script`: one Lua call per batch returning every key's PTTL;
- `sparse`: one Lua call per batch returning (position, PTTL) of the keys that have
  an expiry only (most keys have none: fewer replies to build and parse).

A benchmark measures them all in the same run and takes the fastest as the ceiling
of reading everything an expiry-comparing check needs. Every worker runs at the
CPU priority (nice) it is given, so that it competes as the readers it is compared
with do.

    python benchmarks/ceiling.py [--ttls pttl|script|sparse] PORT [PORT ...]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import hiredis
from _smoke import parse_args


@dataclass(frozen=True)
class Ceiling:
    """All replicas read at once: wall seconds, client CPU seconds, per-replica keys/bytes."""

    seconds: float
    cpu_s: float
    keys: list[int]
    value_bytes: list[int]
    worker_rss_mb: list[float]
    ttls: str | None = None
    nice: int = 0

    def line(self) -> str:
        rates = ", ".join(f"{k / self.seconds:,.0f}" for k in self.keys)
        what = f"SCAN + MGET + {TTL_LABELS[self.ttls]}" if self.ttls else "SCAN + MGET"
        return (
            f"ceiling {self.ttls or 'bare'} ({len(self.keys)} replicas read at once, "
            f"pipelined {what}, one process each at nice {self.nice}): "
            f"{self.seconds:.2f} s, "
            f"{sum(self.keys):,} keys, "
            f"{sum(self.value_bytes) / 1e6:,.0f} MB of values, {rates} keys/s per replica, "
            f"client CPU {self.cpu_s:.1f} s"
        )


TTL_METHODS = ("pttl", "script", "sparse")
TTL_LABELS = {
    "pttl": "one PTTL per key",
    "script": "a script returning every PTTL",
    "sparse": "a script returning only the PTTLs that are set",
}
# The user's own scripts (not replag's): every key's PTTL, or (position, PTTL) pairs of
# the keys that have an expiry.
SCRIPTS = {
    "script": b"local out = {} for i, key in ipairs(KEYS) do "
    b"out[i] = redis.call('PTTL', key) end return out",
    "sparse": b"local out = {} for i, key in ipairs(KEYS) do "
    b"local t = redis.call('PTTL', key) "
    b"if t ~= -1 then out[#out + 1] = i; out[#out + 1] = t end end return out",
}


def _pack(*args: bytes) -> bytes:
    return bytes(hiredis.pack_command(args))  # type: ignore[arg-type]


def read_all(port: int, count: int = 1000, *, ttls: str | None = None) -> tuple[int, int]:
    """Read every key of the server on `port` (and its TTL, the `ttls` way): (keys, bytes
    of values)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = hiredis.Reader()
    recv, feed, gets = sock.recv, reader.feed, reader.gets
    count_arg = str(count).encode()

    def reply() -> object:
        while (item := gets()) is False:
            data = recv(1 << 20)
            if not data:
                raise ConnectionError(f"127.0.0.1:{port} closed the connection")
            feed(data)
        return item

    keys_seen = value_bytes = 0
    sha = b""
    if ttls in SCRIPTS:
        sock.sendall(_pack(b"SCRIPT", b"LOAD", SCRIPTS[ttls]))
        sha = reply()  # type: ignore[assignment]
    sock.sendall(_pack(b"SCAN", b"0", b"COUNT", count_arg))
    pending = 0  # replies owed for the previous batch's MGET and TTLs
    while True:
        cursor, keys = reply()  # type: ignore[misc]
        out = b""
        if cursor != b"0":
            out += _pack(b"SCAN", cursor, b"COUNT", count_arg)
        owed = 0
        if keys:
            out += _pack(b"MGET", *keys)
            owed = 1
            if ttls == "pttl":
                out += b"".join(_pack(b"PTTL", key) for key in keys)
                owed += len(keys)
            elif ttls:
                out += _pack(b"EVALSHA", sha, str(len(keys)).encode(), *keys)
                owed += 1
        if out:
            sock.sendall(out)
        value_bytes += _drain(reply, pending)
        pending = owed
        keys_seen += len(keys)
        if cursor == b"0":
            break
    value_bytes += _drain(reply, pending)
    sock.close()
    return keys_seen, value_bytes


def _drain(reply: Callable[[], object], owed: int) -> int:
    """Read one batch's MGET reply and the `owed - 1` TTL replies after it: the bytes of
    the values."""
    if not owed:
        return 0
    values = reply()
    for _ in range(owed - 1):
        reply()
    return sum(map(len, filter(None, values)))  # type: ignore[call-overload]


def _worker(port: int, count: int, ttls: str | None, nice: int) -> None:
    if nice:
        os.nice(nice)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    keys, value_bytes = read_all(port, count, ttls=ttls)
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "keys": keys,
                "bytes": value_bytes,
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "rss_mb": usage.ru_maxrss / 1024,
            }
        )
    )


def measure_ceiling(
    ports: list[int], count: int = 1000, *, ttls: str | None = None, nice: int = 0
) -> Ceiling:
    """Read every server in `ports` completely (with `ttls`, their TTLs too, that way), all
    at once, one process each at priority `nice`."""
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                str(port),
                str(count),
                ttls or "-",
                str(nice),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for port in ports
    ]
    try:
        for w in workers:
            assert w.stdout is not None
            if w.stdout.readline().strip() != "ready":
                raise RuntimeError("a ceiling worker did not start")
        started = time.perf_counter()
        for w in workers:
            assert w.stdin is not None
            w.stdin.write("go\n")
            w.stdin.flush()
        results = []
        for w in workers:
            out, _ = w.communicate()
            if w.returncode != 0:
                raise RuntimeError(f"a ceiling worker failed (exit {w.returncode})")
            results.append(json.loads(out))
        seconds = time.perf_counter() - started
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    return Ceiling(
        seconds=seconds,
        cpu_s=sum(r["cpu_s"] for r in results),
        keys=[r["keys"] for r in results],
        value_bytes=[r["bytes"] for r in results],
        worker_rss_mb=[r["rss_mb"] for r in results],
        ttls=ttls,
        nice=nice,
    )


def _smoke_ceiling(ttls: str | None) -> None:
    """The ceiling of one server of our own holding 2,000 keys, a tenth of them with TTLs."""
    import tempfile
    from pathlib import Path

    import redis

    from replag.lab.server import RedisServer, free_port

    with tempfile.TemporaryDirectory(prefix="replag-ceiling-") as tmp:
        server = RedisServer(name="ceiling", port=free_port(), workdir=Path(tmp)).start()
        try:
            client = redis.Redis(port=server.port)
            pipe = client.pipeline(transaction=False)
            for i in range(2000):
                pipe.set(f"k:{i}", b"v" * 64, px=600_000 if i % 10 == 0 else None)
            pipe.execute()
            client.close()
            for method in (None, ttls or TTL_METHODS[0]):
                print(measure_ceiling([server.port], ttls=method).line())
        finally:
            server.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        method = None if sys.argv[4] == "-" else sys.argv[4]
        _worker(int(sys.argv[2]), int(sys.argv[3]), method, int(sys.argv[5]))
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--ttls", choices=TTL_METHODS)
        parser.add_argument("--nice", type=int, default=0)
        parser.add_argument("ports", type=int, nargs="*", help="servers to read (--smoke: its own)")
        args = parse_args(parser)
        if args.ports:
            print(measure_ceiling(args.ports, ttls=args.ttls, nice=args.nice).line())
        elif args.smoke:
            _smoke_ceiling(args.ttls)
        else:
            parser.error("name the ports of the servers to read")
