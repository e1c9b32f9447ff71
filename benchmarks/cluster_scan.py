"""Reading a Redis Cluster node completely: one MGET per slot of a batch, or a read per key.

A Cluster node refuses an MGET whose keys lie in different slots (CROSSSLOT),
so a check must either group each SCAN batch by slot (one MGET per slot) or
read every key on its own (a GET per key, pipelined: what a user's script over
a cluster client does). Which costs the server less depends on how SCAN walks
the node: Redis 7.2+ and Valkey keep one table per slot and SCAN walks them in
order, so a batch of 1,000 keys holds few slots where each holds many keys
(Valkey 9, 50,000 keys on one node: about 310 slots a batch); older servers
hash every key into one table, and a batch holds about one key per slot. This
measured which way replag's scan takes: one MGET per slot where a batch spans
one or two slots (SCAN walking dense slots in order), else a GET per key; the
third way below is what replag's scan sends, from its own code.

A cluster of one primary (every slot) and one replica is loaded with N keys of
100 bytes (with `--tags T`, spread over T hash tags: T slots, as dense as the
slots of a node holding many millions of keys; 0: plain names, every slot); the
replica (READONLY) is read completely, each batch's values and PTTLs pipelined
in one write, both ways, `--rounds` times interleaved. Prints per way the
median wall time, keys/s, and the server's CPU per key (INFO cpu), and their
ratio; then a full `replag repair check` of the shard (primary and replica,
each scanned in a process of its own) against the bare per-key reader reading
both nodes at once in two processes (the ceiling a user could script),
interleaved, medians. The host is shared: figures come from one run.

    python benchmarks/cluster_scan.py [--keys 200000] [--rounds 3] [--servers redis-7,valkey-9]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import hiredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.config import load_config
from replag.discovery.cluster import discover_cluster
from replag.repair import check
from replag.repair.keyspace.slots import slot_groups
from replag.repair.scan.scanner import ReplicaScanner, ScanOptions
from replag.topology import Endpoint
from replag.wire.resp import pack, pack_over_keys, pack_per_key
from tests.helpers.redis_cluster import start_cluster
from tests.helpers.server_kinds import kind_binary, using_server_kind

Fetch = Callable[[list[bytes]], tuple[bytes, int]]


def per_slot(keys: list[bytes]) -> tuple[bytes, int]:
    """An MGET per slot of the batch, a PTTL per key."""
    groups = slot_groups(keys)
    mgets = b"".join(pack_over_keys([keys[i] for i in g], (b"MGET",)) for g in groups)
    return mgets + pack_per_key(b"PTTL", keys), len(groups) + len(keys)


def per_key(keys: list[bytes]) -> tuple[bytes, int]:
    """A GET and a PTTL per key (the ceiling)."""
    return pack_per_key(b"GET", keys) + pack_per_key(b"PTTL", keys), 2 * len(keys)


def replags(keys: list[bytes]) -> tuple[bytes, int]:
    """What replag's scan of a Cluster node sends for the batch (its own code)."""
    return _SCANNER.fetch_request(keys, "pttl")


_SCANNER = ReplicaScanner(Endpoint(name="n", host="127.0.0.1", port=1, cluster=True), ScanOptions())


class Reader:
    """One raw socket, replies parsed by hiredis and dropped."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        self.request(pack(b"READONLY"), 1)

    def request(self, payload: bytes, count: int) -> list[object]:
        self.sock.sendall(payload)
        out: list[object] = []
        while len(out) < count:
            reply = self.reader.gets()
            if reply is False:
                self.reader.feed(self.sock.recv(1 << 18))
                continue
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(str(reply))
            out.append(reply)
        return out

    def cpu_s(self) -> float:
        (info,) = self.request(pack(b"INFO", b"cpu"), 1)
        assert isinstance(info, bytes)
        fields = dict(line.split(":", 1) for line in info.decode().splitlines() if ":" in line)
        return float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])

    def read_all(self, fetch: Fetch) -> tuple[int, int]:
        """Every key: (keys, SCAN batches). A batch's reads and the next SCAN go out in one
        write, so the server computes the SCAN while this side parses the reads."""
        keys_read, trips = 0, 0
        ((cursor, keys),) = self.request(pack(b"SCAN", 0, b"COUNT", 1000), 1)  # type: ignore[misc]
        while True:
            trips += 1
            payload, count = fetch(keys) if keys else (b"", 0)
            more = cursor != b"0"
            if more:
                payload += pack(b"SCAN", cursor, b"COUNT", 1000)
            replies = self.request(payload, count + more)
            keys_read += len(keys)
            if not more:
                return keys_read, trips
            cursor, keys = replies[-1]  # type: ignore[misc]


def _read_node(port: int) -> int:
    return Reader(port).read_all(per_key)[0]


def load(port: int, keys: int, tags: int) -> None:
    """`keys` strings of 100 bytes, pipelined (every slot is on this node)."""
    reader = Reader(port)
    value = b"x" * 100

    def name(i: int) -> bytes:
        return b"k:{%d}:%d" % (i % tags, i) if tags else b"k:%d" % i

    for start in range(0, keys, 5000):
        batch = [name(i) for i in range(start, min(keys, start + 5000))]
        reader.request(b"".join(pack(b"SET", k, value) for k in batch), len(batch))
    reader.request(pack(b"WAIT", 1, 10000), 1)


def measure(kind: str, keys: int, rounds: int, tags: int) -> None:
    binary, missing = kind_binary(kind)
    if binary is None:
        print(f"{kind}: skipped ({missing})")
        return
    with tempfile.TemporaryDirectory() as tmp, using_server_kind(binary):
        cluster = start_cluster(Path(tmp), primaries=1)
        try:
            load(cluster.primaries[0].port, keys, tags)
            replica = cluster.replicas[0].port
            ways: dict[str, Fetch] = {
                "per-key GET": per_key,
                "per-slot MGET": per_slot,
                "replag's scan": replags,
            }
            seconds: dict[str, list[float]] = {w: [] for w in ways}
            cpu: dict[str, list[float]] = {w: [] for w in ways}
            trips = 0
            for _ in range(rounds):
                for way, fetch in ways.items():
                    reader = Reader(replica)
                    before, started = reader.cpu_s(), time.perf_counter()
                    read, trips = reader.read_all(fetch)
                    seconds[way].append(time.perf_counter() - started)
                    cpu[way].append(reader.cpu_s() - before)
                    assert read >= keys, (way, read)
            spread = f"over {tags} hash tags" if tags else "plain names"
            print(f"{kind}, {keys:,} keys ({spread}), {trips} SCAN batches, {rounds} rounds:")
            for way in ways:
                wall, used = statistics.median(seconds[way]), statistics.median(cpu[way])
                print(
                    f"  {way:<24} {wall:6.2f} s  {keys / wall:>9,.0f} keys/s  "
                    f"server CPU {1e6 * used / keys:5.2f} µs/key"
                )
            key, slot, mine = (statistics.median(seconds[w]) for w in ways)
            print(
                f"  per-slot MGET / per-key GET: {slot / key:.2f}× the time; "
                f"replag's / the faster: {mine / min(key, slot):.2f}×"
            )
            path = Path(tmp) / "cluster.toml"
            found = asyncio.run(discover_cluster(cluster.url, timeout_s=5))
            path.write_text(found.render() + f'\n[settings]\nstore = "{tmp}/s.db"\nscan_nice = 0\n')
            config = load_config(path)
            ports = [cluster.primaries[0].port, replica]
            checks, ceilings = [], []
            for _ in range(rounds):
                started = time.perf_counter()
                report = asyncio.run(check(config))
                checks.append(time.perf_counter() - started)
                assert report.divergent == 0
                started = time.perf_counter()
                with multiprocessing.get_context("fork").Pool(2) as pool:
                    pool.map(_read_node, ports)
                ceilings.append(time.perf_counter() - started)
            wall, ceiling = statistics.median(checks), statistics.median(ceilings)
            print(
                f"  replag repair check of the shard (primary + replica): {wall:.2f} s; "
                f"ceiling (both read at once, per-key GET + PTTL): {ceiling:.2f} s; "
                f"{wall / ceiling:.2f}× the ceiling"
            )
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", default="redis-7,valkey-9")
    parser.add_argument("--tags", default="0,64", help="hash tags per run (0: plain names)")
    args = parse_args(parser, keys=3000, rounds=1, servers="valkey-9", tags="0")
    for tags in (int(t) for t in args.tags.split(",")):
        for kind in args.servers.split(","):
            measure(kind, args.keys, args.rounds, tags)


if __name__ == "__main__":
    main()
