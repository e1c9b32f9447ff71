"""The physical ceiling of a full read: every replica read completely, all at once.

One process per replica walks SCAN and fetches every batch with MGET on one
raw socket, replies parsed by hiredis and dropped: nothing a checker could
skip. The next SCAN and the MGET of the keys just returned go out together
before the previous MGET's reply is parsed, so the server never waits for
the client. The workers connect first and start together; the wall time is
from that start to the last one's end. Benchmarks call `measure_ceiling` in
the same run as the thing they compare to it, on the same servers.

With `ttls`, each batch's TTLs are fetched too, by the script a check uses on
replicas that hold expiring keys (`replag.repair.scan.TTL_SCRIPT`): the
ceiling of reading everything a check's digest needs, not only the values.

    python benchmarks/ceiling.py [--ttls] PORT [PORT ...]      # prints the figures
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import hiredis


@dataclass(frozen=True)
class Ceiling:
    """All replicas read at once: wall seconds, client CPU seconds, per-replica keys/bytes."""

    seconds: float
    cpu_s: float
    keys: list[int]
    value_bytes: list[int]
    worker_rss_mb: list[float]
    ttls: bool = False

    def line(self) -> str:
        rates = ", ".join(f"{k / self.seconds:,.0f}" for k in self.keys)
        what = "SCAN + MGET + the TTL script" if self.ttls else "bare pipelined SCAN + MGET"
        return (
            f"{'ceiling with TTLs' if self.ttls else 'ceiling'} ({len(self.keys)} replicas "
            f"read at once, {what}, one process each): {self.seconds:.2f} s, "
            f"{sum(self.keys):,} keys, "
            f"{sum(self.value_bytes) / 1e6:,.0f} MB of values, {rates} keys/s per replica, "
            f"client CPU {self.cpu_s:.1f} s"
        )


def _pack(*args: bytes) -> bytes:
    return bytes(hiredis.pack_command(args))  # type: ignore[arg-type]


def read_all(port: int, count: int = 1000, *, ttls: bool = False) -> tuple[int, int]:
    """Read every key of the server on `port` (and its TTL, with `ttls`): (keys, bytes of
    values)."""
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
    if ttls:
        from replag.repair.scan import TTL_SCRIPT

        sock.sendall(_pack(b"SCRIPT", b"LOAD", TTL_SCRIPT))
        sha = reply()  # type: ignore[assignment]
    sock.sendall(_pack(b"SCAN", b"0", b"COUNT", count_arg))
    mget_pending = False
    while True:
        cursor, keys = reply()  # type: ignore[misc]
        out = b""
        if cursor != b"0":
            out += _pack(b"SCAN", cursor, b"COUNT", count_arg)
        if keys:
            out += _pack(b"MGET", *keys)
            if ttls:
                out += _pack(b"EVALSHA", sha, str(len(keys)).encode(), *keys)
        if out:
            sock.sendall(out)
        if mget_pending:
            values = reply()
            value_bytes += sum(map(len, filter(None, values)))  # type: ignore[arg-type]
            if ttls:
                reply()
        mget_pending = bool(keys)
        keys_seen += len(keys)
        if cursor == b"0":
            break
    if mget_pending:
        values = reply()
        value_bytes += sum(map(len, filter(None, values)))  # type: ignore[arg-type]
        if ttls:
            reply()
    sock.close()
    return keys_seen, value_bytes


def _worker(port: int, count: int, ttls: bool) -> None:
    if ttls:
        import replag.repair.scan  # noqa: F401  (its import is not part of the read)
    # Imported before "go", so every worker starts reading at the same moment.
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


def measure_ceiling(ports: list[int], count: int = 1000, *, ttls: bool = False) -> Ceiling:
    """Read every server in `ports` completely (with `ttls`, their TTLs too), all at once,
    one process each."""
    workers = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", str(port), str(count)]
            + (["--ttls"] if ttls else []),
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
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(int(sys.argv[2]), int(sys.argv[3]), "--ttls" in sys.argv[4:])
    else:
        with_ttls = "--ttls" in sys.argv[1:]
        ports = [int(p) for p in sys.argv[1:] if p != "--ttls"]
        print(measure_ceiling(ports, ttls=with_ttls).line())
