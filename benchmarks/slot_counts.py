"""What comparing slot counts (CLUSTER SLOT-STATS) costs, beside the full check it rides on.

A cluster of three primaries with a replica each holds N keys spread over every slot,
none divergent. Per server kind, measured in the same run:

- the full check (`replag repair check`), the anchor: its seconds;
- the slot-count comparison alone (`repair.slot_counts`, every shard, as the check runs
  it at its end): its seconds, the ratio to the check, the SLOT-STATS calls made, the
  bytes they answered and the CPU they cost the servers (INFO's used_cpu_sys+user,
  summed over the nodes, minus what as many PINGs cost: the servers' own tick);
- the same comparison under a writer (random keys, as fast as one client goes): how
  many comparisons were exact (one replication offset), how many slots were named
  (false: nothing is divergent; must be 0) and how many were left unconfirmed;
- detection: keys written on one primary with replication off (the replica misses
  them), in `--planted` slots: how many of those slots the comparison names.

    python benchmarks/slot_counts.py [--keys 300000] [--rounds 20] [--planted 5]
        [--servers valkey-9,redis-8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import hiredis
import redis
import redis.cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.config import Config, load_config
from replag.discovery.cluster import discover_cluster
from replag.repair import check
from replag.repair.keyspace.slots import key_slot
from replag.repair.slot_counts import SlotCountCheck
from replag.topology import Endpoint
from replag.wire.resp import pack
from replag.wire.slot_stats import COMMAND
from tests.helpers.redis_cluster import RedisClusterNodes, start_cluster
from tests.helpers.reshard import UNREPLICATED, load_keys, server_binary
from tests.helpers.server_kinds import using_server_kind


def writer(cluster: RedisClusterNodes, keys: int, stop: threading.Event, done: list[int]) -> None:
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.primaries[0].port)
    n = 0
    try:
        while not stop.is_set():
            client.set(f"k:{random.randrange(keys)}", str(n))
            n += 1
    finally:
        client.close()
        done.append(n)


def server_cpu_s(cluster: RedisClusterNodes) -> float:
    total = 0.0
    for node in cluster.nodes:
        with node.client() as c:
            info = c.info("cpu")
            total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


def reply_bytes(cluster: RedisClusterNodes) -> int:
    """Bytes one SLOT-STATS of every node answers (RESP2, as replag reads it)."""
    total = 0
    for node in cluster.nodes:
        reader = hiredis.Reader()
        with socket.create_connection(("127.0.0.1", node.port), timeout=5) as sock:
            sock.sendall(pack(*COMMAND))
            while True:
                data = sock.recv(1 << 16)
                total += len(data)
                reader.feed(data)
                if reader.gets() is not False:
                    break
    return total


def _primary(member: Endpoint) -> bool:
    with redis.Redis(host=member.host, port=member.port) as c:
        return c.info("replication")["role"] == "master"


def checks(config: Config) -> list[SlotCountCheck]:
    out = []
    for group in config.topology.groups:
        (primary,) = [m for m in group.members if _primary(m)]
        replicas = [m for m in group.members if m is not primary]
        out.append(SlotCountCheck(primary, replicas, timeout_s=5.0))
    return out


async def compare_all(config: Config) -> tuple[float, list[dict[str, object]], int]:
    started = time.perf_counter()
    rows: list[dict[str, object]] = []
    reads = 0
    for counts in checks(config):
        rows += await counts.compare()
        reads += counts.reads
        if counts.missing:
            raise SystemExit(f"slot counts not compared: {counts.missing}")
    return time.perf_counter() - started, rows, reads


async def pings(cluster: RedisClusterNodes, n: int) -> None:
    for node in cluster.nodes[:n]:
        with node.client() as c:
            c.ping()


async def measure(cluster: RedisClusterNodes, args: argparse.Namespace, tmp: str) -> str:
    found = await discover_cluster(cluster.url, timeout_s=5)
    path = Path(tmp) / "cluster.toml"
    path.write_text(found.render() + f'\n[settings]\nstore = "{tmp}/s.db"\n')
    config = load_config(path)
    started = time.perf_counter()
    report = await check(config)
    check_s = time.perf_counter() - started
    assert report.divergent == 0, report.render()
    times, reads = [], 0
    cpu0 = server_cpu_s(cluster)
    for _ in range(args.rounds):
        seconds, rows, n = await compare_all(config)
        times.append(seconds)
        reads += n
        assert all(r["slots_differing"] == 0 for r in rows), rows
    cpu = server_cpu_s(cluster) - cpu0
    base0 = server_cpu_s(cluster)
    for _ in range(args.rounds):
        await pings(cluster, len(cluster.nodes))
    tick = server_cpu_s(cluster) - base0
    per = sorted(times)[len(times) // 2]
    size = reply_bytes(cluster)
    quiet = (
        f"quiet: slot counts of {len(cluster.replicas)} replicas {per * 1000:.1f} ms (median of "
        f"{args.rounds}) vs the full check {check_s:.2f} s: ratio {per / check_s:.4f}; "
        f"{reads / args.rounds:.0f} SLOT-STATS calls, {size / 1024:.0f} KiB answered, server "
        f"CPU {max(0.0, cpu - tick) / args.rounds * 1000:.1f} ms per comparison"
    )
    stop, writes = threading.Event(), []
    thread = threading.Thread(target=writer, args=(cluster, args.keys, stop, writes))
    thread.start()
    exact = named = unconfirmed = total = 0
    begun = time.perf_counter()
    try:
        await asyncio.sleep(0.5)
        for _ in range(args.rounds):
            _, rows, _ = await compare_all(config)
            for row in rows:
                total += 1
                exact += bool(row["exact"])
                named += int(str(row["slots_differing"]))
                unconfirmed += int(str(row["unconfirmed"]))
    finally:
        stop.set()
        thread.join()
    rate = writes[0] / (time.perf_counter() - begun)
    loaded = (
        f"under {rate:,.0f} writes/s: {exact} of {total} comparisons exact, false slots named "
        f"{named}, unconfirmed {unconfirmed}"
    )
    planted = plant(cluster, args.planted)
    await asyncio.sleep(0.2)
    _, rows, _ = await compare_all(config)
    seen = {
        s
        for r in rows
        for a, b in r["slots"]
        for s in range(a, b + 1)  # type: ignore[misc]
    }
    detected = f"planted: {len(planted & seen)} of {len(planted)} slots a replica missed named"
    return f"{quiet}; {loaded}; {detected}"


def plant(cluster: RedisClusterNodes, count: int) -> set[int]:
    """`count` keys, each in a slot of its own, written on the first primary only."""
    slots: set[int] = set()
    with cluster.primaries[0].client() as c:
        port = cluster.primaries[0].port
        mine = {s for a, b, p, *_ in c.execute_command("CLUSTER", "SLOTS") if p[1] == port
                for s in range(a, b + 1)}  # fmt: skip
        n = 0
        while len(slots) < count:
            key = f"planted:{{p{n}}}"
            slot = key_slot(key.encode())
            n += 1
            if slot in mine and slot not in slots:
                c.eval(UNREPLICATED, 1, key, "only on the primary")
                slots.add(slot)
    return slots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--planted", type=int, default=5)
    parser.add_argument("--servers", default="valkey-9,redis-8")
    args = parse_args(parser, keys=3000, rounds=2, planted=2, servers="valkey-9")
    for kind in args.servers.split(","):
        binary = server_binary(kind)
        if binary is None:
            print(f"{kind}: no server binary, skipped")
            continue
        with tempfile.TemporaryDirectory() as tmp, using_server_kind(binary):
            cluster = start_cluster(Path(tmp))
            try:
                load_keys(cluster, args.keys)
                line = asyncio.run(measure(cluster, args, tmp))
            finally:
                cluster.stop()
        print(f"{kind} ({args.keys:,} keys, load {os.getloadavg()[0]:.1f}): {line}", flush=True)


if __name__ == "__main__":
    main()
