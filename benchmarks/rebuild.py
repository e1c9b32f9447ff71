"""Rebuilding an emptied replica: `repair rebuild` against the bare copy a user could script.

3 independent redis-servers × N keys × ~1 KB (90 % strings, 10 % small hashes, sets,
sorted sets, lists and streams; 10 % of all keys with a TTL), one replica emptied.
Prints, from one run:

- the bare ceiling: the fastest of two unsafe copies written with redis-py (SCAN,
  then pipelined DUMP + PTTL and RESTORE … REPLACE; or MGET + PTTL and pipelined
  SET [PX] for strings, DUMP/RESTORE for the rest), in a process of their own;
- Redis's own full sync, timed: the emptied server made a replica of a peer
  (REPLICAOF), then detached (the Dynomite-manager way, before its anti-entropy pass);
- replag's rebuild alone (the bulk copy, and the anti-entropy pass after it), keys/s
  and the ratio to the ceiling;
- the same with the safety harness's writers (`--writers`, default 12) writing to every
  replica through the rebuild, on a versioned keyspace of their own, and the checker's
  anomaly counts from their history (clobbered, resurrected, lost, falsely fixed; no
  operation is exempted, however slow its fan-out);
- after each, whether the replicas are equal, by DUMP and PTTL of every key (a value
  whose DUMP differs only by encoding is compared by the check's canonical digest).

First, against RedisShake (the issue's case): N × 200 B strings, 10 % with TTLs, on 2 of
3 replicas, the third emptied and refilled by each tool in turn, three interleaved
rounds: RedisShake's scan copy (scan reader, count 1000: DUMP/PTTL + RESTORE) and its
sync copy (sync reader: PSYNC and the source's RDB, no AOF tail; the source must write
a Redis RDB, e.g. REPLAG_REDIS_SERVER=/usr/bin/redis-server) when `REDIS_SHAKE` names
its binary, the naive script (unless `--skip-naive`) (redis-py with hiredis: SCAN 1000 +
MGET/PTTL + SET PX), the whole `replag repair rebuild` command (a process of its
own: planning, copy, closing pass) and `replag repair run` of the group (a check of
all three, then the same bulk refill). Each run: keys/s, CPU per 1M keys (the tool's
process with its children, from wait4; each server's, from /proc), whether the copy is
exact (every key's value and PTTL equal), the load average; then the median ratios.

    REDIS_SHAKE=/path/to/redis-shake python benchmarks/rebuild.py [--keys 1000000] [--writers 12]
    python benchmarks/rebuild.py --only-shake --keys 500000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.config import Config, config_from_dict
from replag.lab.safety.checker import check_history
from replag.lab.safety.harness import _start, _stop_writers, read_final
from replag.lab.safety.model import LOADED, Keyspace, state_commands
from replag.lab.safety.workload import WorkloadSpec, read_history
from replag.lab.server import RedisServer, free_port
from replag.repair import repair
from replag.repair.keyspace.observe import observe_keys
from replag.repair.rebuild import rebuild
from replag.repair.runs import RunLog
from replag.store import Store
from replag.topology import Endpoint
from replag.wire.resp import RespConnection, pack

KINDS = ("hash", "set", "zset", "list", "stream")
TTL_MS = 4 * 3600 * 1000


# --- the bare ceiling: what a user scripts with redis-py, no safety -----------------


def _copy_dump_restore(src: redis.Redis, dst: redis.Redis) -> int:
    copied, cursor = 0, 0
    while True:
        cursor, keys = src.scan(cursor, count=1000)
        if keys:
            pipe = src.pipeline(transaction=False)
            for key in keys:
                pipe.pttl(key)
                pipe.dump(key)
            got = pipe.execute()
            out = dst.pipeline(transaction=False)
            for i, key in enumerate(keys):
                ttl, payload = got[2 * i], got[2 * i + 1]
                if payload is not None and ttl != -2:
                    out.restore(key, max(ttl, 0), payload, replace=True)
                    copied += 1
            out.execute()
        if cursor == 0:
            return copied


def _copy_mget_set(src: redis.Redis, dst: redis.Redis) -> int:
    copied, cursor = 0, 0
    while True:
        cursor, keys = src.scan(cursor, count=1000)
        if keys:
            pipe = src.pipeline(transaction=False)
            pipe.mget(keys)
            for key in keys:
                pipe.pttl(key)
            values, *ttls = pipe.execute()
            rows = list(zip(keys, values, ttls, strict=True))
            others = [k for k, v, t in rows if v is None and t != -2]
            dumps: dict[bytes, Any] = {}
            if others:
                pipe = src.pipeline(transaction=False)
                for key in others:
                    pipe.dump(key)
                dumps = dict(zip(others, pipe.execute(), strict=True))
            out = dst.pipeline(transaction=False)
            for key, value, ttl in zip(keys, values, ttls, strict=True):
                if value is not None:
                    out.set(key, value, px=ttl if ttl > 0 else None)
                elif dumps.get(key) is not None:
                    out.restore(key, max(ttl, 0), dumps[key], replace=True)
                else:
                    continue
                copied += 1
            out.execute()
        if cursor == 0:
            return copied


def baseline(src_port: int, dst_port: int) -> None:
    """In a process of its own: each unsafe copy into the emptied replica, timed."""
    src, dst = redis.Redis(port=src_port), redis.Redis(port=dst_port)
    out = {}
    for name, copy in (("dump_restore", _copy_dump_restore), ("mget_set", _copy_mget_set)):
        dst.flushall()
        started = time.perf_counter()
        copied = copy(src, dst)
        out[name] = {"keys": copied, "seconds": time.perf_counter() - started}
    dst.flushall()
    print(json.dumps(out))


# --- the data -------------------------------------------------------------------------


def _commands(start: int, stop: int, value_size: int, expire_at: int) -> tuple[bytes, int]:
    out: list[bytes] = []
    strings: list[bytes] = []
    for i in range(start, stop):
        key = b"rb:%09d" % i
        kind = KINDS[(i // 10) % len(KINDS)] if i % 10 == 9 else "string"
        if kind == "string":
            strings += [key, (b"%d:" % i).ljust(value_size, b"v")]
        else:
            element = b"x" * (value_size // 8 - 12)
            if kind == "hash":
                pairs = [x for j in range(8) for x in (b"f%d" % j, element)]
                out.append(pack(b"HSET", key, *pairs))
            elif kind == "set":
                out.append(pack(b"SADD", key, *[b"%d.%d" % (i, j) + element for j in range(8)]))
            elif kind == "zset":
                pairs = [x for j in range(8) for x in (b"%d" % j, b"m%d" % j + element)]
                out.append(pack(b"ZADD", key, *pairs))
            elif kind == "list":
                out.append(pack(b"RPUSH", key, *[element + b"%d" % j for j in range(8)]))
            else:
                out += [pack(b"XADD", key, b"%d-1" % (j + 1), b"f", element) for j in range(8)]
    if strings:
        out.insert(0, pack(b"MSET", *strings))
    # 10 % with a TTL (the same absolute expiry on every replica).
    expiring = [i for i in range(start, stop) if i % 10 == 4]
    out += [pack(b"PEXPIREAT", b"rb:%09d" % i, expire_at) for i in expiring]
    return b"".join(out), len(out)


async def send_pipelined(
    endpoints: list[Endpoint], payloads: Callable[[], Iterator[tuple[bytes, int]]]
) -> None:
    """Send `payloads()` (bytes, command count) to every endpoint, four payloads in flight."""

    async def one(endpoint: Endpoint) -> None:
        conn = await RespConnection.open(endpoint, timeout_s=60)
        try:
            pending = []
            for payload, count in payloads():
                pending.append(conn.send(payload, count))
                if len(pending) >= 4:
                    conn.check((await conn.wait(pending.pop(0)))[0])
            for future in pending:
                conn.check((await conn.wait(future))[0])
        finally:
            await conn.close()

    await asyncio.gather(*(one(e) for e in endpoints))


async def load(endpoints: list[Endpoint], keys: int, value_size: int, safety: Keyspace) -> None:
    expire_at = time.time_ns() // 1_000_000 + TTL_MS

    def payloads() -> Iterator[tuple[bytes, int]]:
        for start in range(0, keys, 2000):
            yield _commands(start, min(keys, start + 2000), value_size, expire_at)
        commands = [
            c
            for i in range(safety.keys)
            for c in state_commands(safety.name(i), safety.type(i), LOADED)
        ]
        yield b"".join(commands), len(commands)

    await send_pipelined(endpoints, payloads)


# --- equality by DUMP and PTTL ----------------------------------------------------------


async def compare(endpoints: list[Endpoint], tolerance_ms: int = 2000) -> dict[str, int]:
    """Every key of every replica: DUMP equal and PTTL within `tolerance_ms` on all; a
    differing DUMP is compared again by canonical digest (the same value, encoded otherwise)."""
    conns = [await RespConnection.open(e, timeout_s=60) for e in endpoints]
    counts = {"keys": 0, "equal_dump": 0, "equal_value": 0, "differ": 0}
    try:
        names: set[bytes] = set()
        for conn in conns:
            cursor = b"0"
            while True:
                ((cursor, keys),) = await conn.request(pack(b"SCAN", cursor, b"COUNT", 2000), 1)
                names.update(keys)
                if cursor == b"0":
                    break
        ordered = sorted(names)
        counts["keys"] = len(ordered)
        for start in range(0, len(ordered), 1000):
            batch = ordered[start : start + 1000]
            payload = b"".join(pack(b"DUMP", k) + pack(b"PTTL", k) for k in batch)
            reads = [await conn.request(payload, 2 * len(batch)) for conn in conns]
            recheck = []
            for i, key in enumerate(batch):
                dumps = {r[2 * i] for r in reads}
                ttls = [r[2 * i + 1] for r in reads]
                ttl_ok = (all(t < 0 for t in ttls) and len(set(ttls)) == 1) or (
                    all(t >= 0 for t in ttls) and max(ttls) - min(ttls) <= tolerance_ms
                )
                if len(dumps) == 1 and ttl_ok:
                    counts["equal_dump"] += 1
                elif ttl_ok:
                    recheck.append(key)
                else:
                    counts["differ"] += 1
            if recheck:
                states = [await observe_keys(conn, recheck, keep=False) for conn in conns]
                for key in recheck:
                    same = all(s[key].same_value(states[0][key]) for s in states[1:])
                    counts["equal_value" if same else "differ"] += 1
    finally:
        for conn in conns:
            await conn.close()
    return counts


def equal_line(counts: dict[str, int]) -> str:
    return (
        f"  replicas at the end: {counts['keys']:,} keys; equal by DUMP and PTTL "
        f"{counts['equal_dump']:,}, same value in another encoding {counts['equal_value']:,}, "
        f"differ {counts['differ']:,}"
    )


# --- against RedisShake and a naive script (the case) ---------------------------


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float, bytes]:
    """Run `command` to its end: (wall s, CPU s of it and its children, stdout)."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{command[0]} … exited {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, out


def naive(src_port: int, dst_port: int) -> None:
    """In a process of its own: the naive script (redis-py with hiredis): SCAN 1000, MGET +
    PTTL, pipelined SET [PX]."""
    src, dst = redis.Redis(port=src_port), redis.Redis(port=dst_port)
    print(json.dumps({"keys": _copy_mget_set(src, dst)}))


def _shake_config(workdir: Path, src: int, dst: int) -> Path:
    """RedisShake v4: its scan reader (SCAN count 1000, DUMP + PTTL) and writer (RESTORE)."""
    path = workdir / "shake.toml"
    path.write_text(
        f'[scan_reader]\naddress = "127.0.0.1:{src}"\ncount = 1000\n\n'
        f'[redis_writer]\naddress = "127.0.0.1:{dst}"\n\n'
        f'[advanced]\ndir = "{workdir / "shake"}"\nlog_level = "warn"\n'
        f'log_file = "shake.log"\nrdb_restore_command_behavior = "panic"\n'
    )
    return path


def _shake_sync_config(workdir: Path, src: int, dst: int) -> Path:
    """RedisShake v4: its sync reader (PSYNC, the source's RDB, no AOF tail: it exits
    once the RDB is applied) and writer (RESTORE)."""
    path = workdir / "shake-sync.toml"
    path.write_text(
        f'[sync_reader]\naddress = "127.0.0.1:{src}"\nsync_rdb = true\nsync_aof = false\n\n'
        f'[redis_writer]\naddress = "127.0.0.1:{dst}"\n\n'
        f'[advanced]\ndir = "{workdir / "shake-sync"}"\nlog_level = "warn"\n'
        f'log_file = "shake.log"\nrdb_restore_command_behavior = "panic"\n'
    )
    return path


def _replag_config(workdir: Path, ports: list[int], settle: str) -> Path:
    path = workdir / "rebuild.toml"
    regions = "".join(
        f'[[regions]]\nname = "r{i}"\n[[regions.replicas]]\nname = "n{i}"\n'
        f'url = "redis://127.0.0.1:{p}"\n\n'
        for i, p in enumerate(ports)
    )
    path.write_text(
        f'[settings]\nstore = "{workdir / "shake-runs.sqlite"}"\nrepair_settle = "{settle}"\n'
        f'connect_timeout = "10s"\nrepair_command_timeout = "20s"\n\n{regions}'
        f'[[groups]]\nname = "g"\nmembers = ["n0", "n1", "n2"]\n'
    )
    return path


async def strings_equal(a: Endpoint, b: Endpoint, tolerance_ms: int = 2000) -> tuple[int, int]:
    """(keys of `a`, keys differing on `b` by value or PTTL) of a strings-only keyspace,
    plus every key `b` holds beyond `a`'s."""
    ca = await RespConnection.open(a, timeout_s=60)
    cb = await RespConnection.open(b, timeout_s=60)
    keys = differ = 0
    try:
        cursor = b"0"
        while True:
            ((cursor, names),) = await ca.request(pack(b"SCAN", cursor, b"COUNT", 1000), 1)
            if names:
                payload = pack(b"MGET", *names) + b"".join(pack(b"PTTL", k) for k in names)
                ra = await ca.request(payload, 1 + len(names))
                rb = await cb.request(payload, 1 + len(names))
                for i in range(len(names)):
                    ta, tb = ra[1 + i], rb[1 + i]
                    ttl_ok = ta == tb or (ta >= 0 and tb >= 0 and abs(ta - tb) <= tolerance_ms)
                    differ += ra[0][i] != rb[0][i] or not ttl_ok
                keys += len(names)
            if cursor == b"0":
                break
        (size_a,) = await ca.request(pack(b"DBSIZE"), 1)
        (size_b,) = await cb.request(pack(b"DBSIZE"), 1)
        differ += max(0, size_b - size_a)
    finally:
        await ca.close()
        await cb.close()
    return keys, differ


async def against_shake(args: argparse.Namespace, workdir: Path) -> None:
    """The issue's case: N × 200 B strings, 10 % with TTLs, on 2 of 3 replicas; the third
    emptied and refilled by each tool in turn, three interleaved rounds."""
    shake = os.environ.get("REDIS_SHAKE")
    if shake and not os.access(shake, os.X_OK):
        raise SystemExit(f"REDIS_SHAKE={shake}: not an executable file")
    servers = [RedisServer(f"c{i}", free_port(), workdir / "shake-redis") for i in range(3)]
    for server in servers:
        server.start()
    try:
        endpoints = [
            Endpoint(name=f"n{i}", host="127.0.0.1", port=s.port) for i, s in enumerate(servers)
        ]
        started = time.perf_counter()
        await load_strings(endpoints[:2], args.keys, args.string_size)
        print(
            f"against RedisShake: 3 independent redis-server replicas, 2 holding {args.keys:,} "
            f"keys × {args.string_size} B strings (10 % with TTLs), loaded in "
            f"{time.perf_counter() - started:.1f} s; the third emptied and refilled by each "
            f"tool, {args.rounds} interleaved rounds; load average "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores"
        )
        if not shake:
            print("  RedisShake: skipped (REDIS_SHAKE does not name its binary)")
        ports = [s.port for s in servers]
        tools: dict[str, list[str]] = {}
        if shake:
            tools["RedisShake"] = [shake, str(_shake_config(workdir, ports[0], ports[2]))]
            tools["RedisShake sync"] = [
                shake, str(_shake_sync_config(workdir, ports[0], ports[2]))
            ]  # fmt: skip
        if not args.skip_naive:
            tools["naive script"] = [
                sys.executable, __file__, "--naive", str(ports[0]), str(ports[2])
            ]  # fmt: skip
        tools["replag rebuild"] = [
            sys.executable, "-m", "replag", "repair", "rebuild",
            "-c", str(_replag_config(workdir, ports, args.settle)),
            "-g", "g", "-r", "n2", "--source", "n0", "--json",
        ]  # fmt: skip
        # `repair run` finds the emptied replica by a check of all three, then refills it
        # by the same bulk path.
        tools["replag repair run"] = [
            sys.executable, "-m", "replag", "repair", "run",
            "-c", str(workdir / "rebuild.toml"), "-g", "g", "--json",
        ]  # fmt: skip
        rates: dict[str, list[float]] = {name: [] for name in tools}
        cpus: dict[str, list[float]] = {name: [] for name in tools}  # s per 1M keys, all
        for round_no in range(1, args.rounds + 1):
            for name, command in tools.items():
                await flush(endpoints[2])
                before = [_cpu_s(s.pid) for s in servers if s.pid is not None]
                wall, cpu, out = _timed(command)
                after = [_cpu_s(s.pid) for s in servers if s.pid is not None]
                _, differ = await strings_equal(endpoints[0], endpoints[2])
                rate = args.keys / wall
                rates[name].append(rate)
                used = [b - a for a, b in zip(before, after, strict=True)]
                per = 1e6 / args.keys
                cpus[name].append(per * (cpu + sum(used)))
                detail = ""
                if name == "replag rebuild":
                    report = json.loads(out)
                    detail = (
                        f"; copy {report['seconds']:.1f} s, closing pass "
                        f"{report['closing_s']:.1f} s ({report['closing_keys']} keys)"
                    )
                print(
                    f"  round {round_no} {name:17s} {args.keys:,} keys in {wall:6.1f} s = "
                    f"{rate:9,.0f} keys/s{detail}; CPU per 1M keys {per * (cpu + sum(used)):.1f} s "
                    f"(tool {per * cpu:.1f}, source {per * used[0]:.1f}, other peer "
                    f"{per * used[1]:.1f}, target {per * used[2]:.1f}); "
                    f"{'exact' if not differ else f'{differ:,} keys DIFFER'}; load "
                    f"{os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        best = {name: statistics.median(r) for name, r in rates.items()}
        mine = best["replag rebuild"]
        for name, rate in best.items():
            if name != "replag rebuild":
                print(
                    f"  median keys/s: replag rebuild {mine:,.0f}, {name} {rate:,.0f}: "
                    f"ratio {mine / rate:.2f}x; load {os.getloadavg()[0]:.2f}"
                )
        # `repair run` on the emptied replica refills it the rebuild's way (wiped_member):
        # under load the CPU it costs is the steadier figure.
        run, mine_cpu = best["replag repair run"], statistics.median(cpus["replag rebuild"])
        run_cpu = statistics.median(cpus["replag repair run"])
        print(
            f"  median: replag repair run {run:,.0f} keys/s, {run_cpu:.1f} s CPU per 1M keys; "
            f"replag rebuild {mine:,.0f} keys/s, {mine_cpu:.1f} s: ratio {run / mine:.2f}x "
            f"(keys/s), {mine_cpu / run_cpu:.2f}x (CPU); load {os.getloadavg()[0]:.2f}"
        )
        for shake_name in ("RedisShake", "RedisShake sync"):
            if shake_name in best:
                print(
                    f"  median keys/s: replag repair run {run:,.0f}, {shake_name} "
                    f"{best[shake_name]:,.0f}: ratio {run / best[shake_name]:.2f}x; load "
                    f"{os.getloadavg()[0]:.2f}"
                )
    finally:
        for server in servers:
            server.stop()


async def load_strings(endpoints: list[Endpoint], keys: int, size: int) -> None:
    expire_at = time.time_ns() // 1_000_000 + TTL_MS

    def payloads() -> Iterator[tuple[bytes, int]]:
        for start in range(0, keys, 2000):
            stop = min(keys, start + 2000)
            pairs = [
                x
                for i in range(start, stop)
                for x in (b"s:%09d" % i, (b"%d:" % i).ljust(size, b"v"))
            ]
            commands = [pack(b"MSET", *pairs)] + [
                pack(b"PEXPIREAT", b"s:%09d" % i, expire_at)
                for i in range(start, stop)
                if i % 10 == 4
            ]
            yield b"".join(commands), len(commands)

    await send_pipelined(endpoints, payloads)


# --- the runs -----------------------------------------------------------------------------


def make_config(endpoints: list[Endpoint], workdir: Path, settle: str) -> Config:
    return config_from_dict(
        {
            # The machine is shared: a scan's batch can wait seconds for a busy core.
            "settings": {
                "store": str(workdir / "replag.sqlite"),
                "repair_settle": settle,
                "connect_timeout": "10s",
                "repair_command_timeout": "20s",
            },
            "regions": [
                {"name": f"r{i}", "replicas": [{"name": e.name, "url": e.url(redact=False)}]}
                for i, e in enumerate(endpoints)
            ],
            "groups": [{"name": "g", "members": [e.name for e in endpoints]}],
        },
        where="benchmark",
    )


async def rebuild_line(config: Config, store: Store, ceiling: float, label: str) -> str:
    report = await rebuild(config, group="g", replica="n2", store=store)
    d = report.to_dict()
    rate = d["keys_read"] / d["seconds"]
    closing = report.closing or {}
    return (
        f"replag rebuild {label}: {d['keys_read']:,} keys read, {d['copied'] + d['big_copied']:,} "
        f"copied in {d['seconds']:.1f} s = {rate:,.0f} keys/s = {100 * rate / ceiling:.0f} % of "
        f"the bare ceiling; then the closing pass {report.closing_s:.1f} s over "
        f"{report.closing_keys if report.closing_keys is not None else 'all'} keys (divergent "
        f"{closing.get('divergent')}, repaired {closing.get('repaired')}, busy "
        f"{closing.get('busy')}); left by the copy: present {d['present']}, peers disagree "
        f"{d['disagree']}, changed {d['changed']}"
    )


async def full_sync_line(target: Endpoint, peer: Endpoint, ceiling: float) -> str:
    """The Dynomite-manager way, timed: the emptied server a replica of a peer through
    Redis's own full sync, then detached (no anti-entropy pass counted)."""
    conn = await RespConnection.open(target, timeout_s=600)
    try:
        started = time.perf_counter()
        conn.check(await conn.request(pack(b"REPLICAOF", peer.host, peer.port), 1))
        while True:
            (info,) = await conn.request(pack(b"INFO", b"replication"), 1)
            text = bytes(info)
            if b"master_link_status:up" in text and b"master_sync_in_progress:0" in text:
                break
            await asyncio.sleep(0.01)
        seconds = time.perf_counter() - started
        conn.check(await conn.request(pack(b"REPLICAOF", b"NO", b"ONE"), 1))
        (keys,) = await conn.request(pack(b"DBSIZE"), 1)
    finally:
        await conn.close()
    rate = keys / seconds
    return (
        f"Redis full sync (REPLICAOF a peer, then REPLICAOF NO ONE; no safety, every client "
        f"write to the target refused or lost meanwhile): {keys:,} keys in {seconds:.1f} s = "
        f"{rate:,.0f} keys/s = {100 * rate / ceiling:.0f} % of the bare ceiling"
    )


async def flush(endpoint: Endpoint) -> None:
    conn = await RespConnection.open(endpoint, timeout_s=60)
    try:
        conn.check(await conn.request(pack(b"FLUSHALL"), 1))
    finally:
        await conn.close()


async def with_writers(
    args: argparse.Namespace,
    config: Config,
    store: Store,
    endpoints: list[Endpoint],
    safety: Keyspace,
    workdir: Path,
    ceiling: float,
) -> None:
    base_ms = time.time_ns() // 1_000_000 + 2 * 3600 * 1000
    history = workdir / "history.jsonl"
    spec = WorkloadSpec(
        ports=tuple(e.port for e in endpoints),
        keys=safety.keys,
        keyspace_seed=safety.seed,
        hot=(),
        seed=1,
        base_ms=base_ms,
        history=str(history),
        writers=args.writers,
        drop_share=0.0,
    )
    spec_path = workdir / "workload.json"
    spec_path.write_text(spec.to_json())
    writers, _ = await _start("replag.lab.safety.workload", str(spec_path))
    try:
        assert writers.stdin is not None
        writers.stdin.write(b"calm\n")
        await writers.stdin.drain()
        line = await rebuild_line(config, store, ceiling, f"with {args.writers} writers")
    finally:
        await _stop_writers(writers)
    ops = read_history(history)
    # After the writers stop: one more pass settles what was busy under them.
    final_run = await repair(config, group="g", store=store)
    keys = [safety.name(i) for i in range(safety.keys)]
    final = [await read_final(e, keys, base_ms) for e in endpoints]
    outcomes: dict[bytes, str] = {}
    for row in RunLog(store, final_run.run_id).keys("g"):
        outcomes[row[0]] = row[2]
    verdict = check_history(
        safety,
        keys,
        [e.name for e in endpoints],
        ops,
        final,
        outcomes,
        bound_ms=float(args.settle.rstrip("ms")),
        repair_touched={},
    )
    slow = sum(op.spread_ms > float(args.settle.rstrip("ms")) for op in ops)
    print(line)
    c = verdict.counts
    print(
        f"  writers: {len(ops):,} operations ({sum(len(o.applied) for o in ops):,} writes) on "
        f"{safety.keys:,} keys, {slow} slower to fan out than repair_settle; anomalies: "
        f"clobbered {c['clobbered']}, resurrected {c['resurrected']}, lost {c['lost']}, "
        f"falsely fixed {c['falsely_fixed']} (none exempted)"
    )
    for example in verdict.examples[:5]:
        print(f"    {example}")
    print(equal_line(await compare(endpoints)))


async def main_async(args: argparse.Namespace, workdir: Path) -> None:
    await against_shake(args, workdir)
    if not args.only_shake:
        await mixed(args, workdir)


async def mixed(args: argparse.Namespace, workdir: Path) -> None:
    servers = [RedisServer(f"s{i}", free_port(), workdir / "redis") for i in range(3)]
    for server in servers:
        server.start()
    try:
        endpoints = [
            Endpoint(name=f"n{i}", host="127.0.0.1", port=s.port) for i, s in enumerate(servers)
        ]
        safety = Keyspace(args.safety_keys, 7)
        started = time.perf_counter()
        await load(endpoints, args.keys, args.value_size, safety)
        print(
            f"3 independent redis-server replicas × {args.keys:,} keys × {args.value_size} B "
            f"(90 % strings, 10 % hash/set/zset/list/stream; 10 % with TTLs) + "
            f"{args.safety_keys:,} writer keys; loaded in {time.perf_counter() - started:.1f} s; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        await flush(endpoints[2])
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--baseline",
            str(servers[0].port),
            str(servers[2].port),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"the baseline failed (exit {proc.returncode})")
        runs = json.loads(out)
        rates = {name: r["keys"] / r["seconds"] for name, r in runs.items()}
        ceiling = max(rates.values())
        print(
            f"bare ceiling (redis-py, no safety): SCAN + DUMP/PTTL + RESTORE "
            f"{rates['dump_restore']:,.0f} keys/s; SCAN + MGET/PTTL + SET (DUMP/RESTORE for "
            f"the rest) {rates['mget_set']:,.0f} keys/s; best {ceiling:,.0f} keys/s"
        )
        print(await full_sync_line(endpoints[2], endpoints[0], ceiling))
        await flush(endpoints[2])
        config = make_config(endpoints, workdir, args.settle)
        store = Store(config.settings.store)
        print(await rebuild_line(config, store, ceiling, "alone"))
        print(equal_line(await compare(endpoints)))
        if args.writers:
            await flush(endpoints[2])
            await with_writers(args, config, store, endpoints, safety, workdir, ceiling)
        store.close()
    finally:
        for server in servers:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-size", type=int, default=1024)
    parser.add_argument("--writers", type=int, default=12)
    parser.add_argument("--safety-keys", type=int, default=20_000)
    parser.add_argument("--settle", default="50ms", help="repair_settle (ms)")
    parser.add_argument("--string-size", type=int, default=200, help="against RedisShake")
    parser.add_argument("--rounds", type=int, default=3, help="against RedisShake")
    parser.add_argument(
        "--only-shake", action="store_true", help="only the comparison with RedisShake"
    )
    parser.add_argument(
        "--skip-naive", action="store_true", help="against RedisShake: no naive script"
    )
    parser.add_argument("--baseline", nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--naive", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parse_args(parser, keys=3000, value_size=64, writers=2, safety_keys=500, rounds=1)
    if args.baseline:
        baseline(*args.baseline)
        return
    if args.naive:
        naive(*args.naive)
        return
    with tempfile.TemporaryDirectory(prefix="replag-rebuild-") as tmp:
        asyncio.run(main_async(args, Path(tmp)))


if __name__ == "__main__":
    main()
