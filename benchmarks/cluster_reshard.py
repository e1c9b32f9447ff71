"""Reshards during checks: false strays and false stale slot marks, per server kind.

A cluster of three primaries with a replica each holds N keys, none divergent and
none stray. A writer keeps writing (load), and each round runs `redis-cli --cluster
reshard` (a random number of slots between two random shards) while `replag repair
check` runs beside it. Nothing is wrong with the cluster at any time, so every key
the check calls stray, every slot it calls a stale mark and every divergent key
are false: the counts printed must be 0. Slots not compared (a live move) are
expected and counted too.

    python benchmarks/cluster_reshard.py [--reshards 20] [--keys 60000]
        [--servers valkey-9,redis-8] [--scan-rate 15000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
import redis.cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.config import load_config
from replag.discovery.cluster import discover_cluster
from replag.repair import check
from tests.helpers.redis_cluster import RedisClusterNodes, start_cluster
from tests.helpers.reshard import load_keys, reshard, server_binary
from tests.helpers.server_kinds import using_server_kind


def writer(cluster: RedisClusterNodes, keys: int, stop: threading.Event, done: list[int]) -> None:
    """Writes to random keys until `stop`: the load the checks run under."""
    client = redis.cluster.RedisCluster(
        host="127.0.0.1", port=cluster.primaries[0].port, cluster_error_retry_attempts=10
    )
    n = 0
    try:
        while not stop.is_set():
            try:
                client.set(f"k:{random.randrange(keys)}", str(n))
                n += 1
            except redis.RedisError:
                time.sleep(0.01)
    finally:
        client.close()
        done.append(n)


async def rounds(cluster: RedisClusterNodes, args: argparse.Namespace, tmp: str) -> dict[str, int]:
    found = await discover_cluster(cluster.url, timeout_s=5)
    path = Path(tmp) / "cluster.toml"
    path.write_text(
        found.render() + f'\n[settings]\nstore = "{tmp}/s.db"\nrepair_settle = "100ms"\n'
        f"scan_rate = {args.scan_rate}\n"
    )
    config = load_config(path)
    totals = {"strays": 0, "stale": 0, "divergent": 0, "not_compared": 0, "failed": 0}
    rng = random.Random(7)
    for _ in range(args.reshards):
        source, dest = rng.sample(range(len(cluster.primaries)), 2)
        moving = asyncio.create_task(
            asyncio.to_thread(reshard, cluster, source, dest, rng.randint(20, args.slots))
        )
        await asyncio.sleep(rng.random() * 0.5)
        report = (await check(config)).to_dict()
        done = await moving
        if done.returncode != 0:
            totals["failed"] += 1
            print(f"reshard failed: {(done.stdout + done.stderr)[-600:]}", file=sys.stderr)
        for group in report["groups"]:
            totals["strays"] += sum(row["keys"] for row in group["stray_keys"])
            totals["stale"] += sum(b - a + 1 for m in group["stale_marks"] for a, b in m["slots"])
            totals["not_compared"] += sum(b - a + 1 for a, b in group["slots_not_compared"])
        totals["divergent"] += report["divergent"]
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reshards", type=int, default=20)
    parser.add_argument("--keys", type=int, default=60_000)
    parser.add_argument("--slots", type=int, default=400, help="most slots one reshard moves")
    parser.add_argument("--scan-rate", type=int, default=15_000)
    parser.add_argument("--servers", default="valkey-9,redis-8")
    args = parse_args(parser, reshards=2, keys=3000, slots=40)
    if shutil.which("redis-cli") is None and not os.access("/usr/bin/redis-cli", os.X_OK):
        sys.exit("redis-cli is needed (apt-get install redis-tools)")
    for kind in args.servers.split(","):
        binary = server_binary(kind)
        if binary is None:
            print(f"{kind}: no server binary, skipped")
            continue
        with tempfile.TemporaryDirectory() as tmp, using_server_kind(binary):
            cluster = start_cluster(Path(tmp))
            stop, writes = threading.Event(), []
            try:
                load_keys(cluster, args.keys)
                thread = threading.Thread(target=writer, args=(cluster, args.keys, stop, writes))
                thread.start()
                started = time.perf_counter()
                try:
                    totals = asyncio.run(rounds(cluster, args, tmp))
                finally:
                    stop.set()
                    thread.join()
                seconds = time.perf_counter() - started
            finally:
                cluster.stop()
        print(
            f"{kind}: {args.reshards} reshards during checks ({args.keys:,} keys, scan_rate "
            f"{args.scan_rate:,}, {writes[0] / seconds:,.0f} writes/s beside them, load "
            f"{os.getloadavg()[0]:.1f}): false strays {totals['strays']}, false stale marks "
            f"{totals['stale']}, false divergent {totals['divergent']}; slots not compared "
            f"{totals['not_compared']}; reshards failed {totals['failed']}; {seconds:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
