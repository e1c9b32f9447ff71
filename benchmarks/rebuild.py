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

    python benchmarks/rebuild.py [--keys 1000000] [--writers 12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
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
from replag.resp import RespConnection, pack
from replag.store import Store
from replag.topology import Endpoint

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


async def load(endpoints: list[Endpoint], keys: int, value_size: int, safety: Keyspace) -> None:
    expire_at = time.time_ns() // 1_000_000 + TTL_MS

    async def one(endpoint: Endpoint) -> None:
        conn = await RespConnection.open(endpoint, timeout_s=60)
        try:
            pending = []
            for start in range(0, keys, 2000):
                payload, count = _commands(start, min(keys, start + 2000), value_size, expire_at)
                pending.append(conn.send(payload, count))
                if len(pending) >= 4:
                    conn.check((await conn.wait(pending.pop(0)))[0])
            commands = [
                c
                for i in range(safety.keys)
                for c in state_commands(safety.name(i), safety.type(i), LOADED)
            ]
            pending.append(conn.send(b"".join(commands), len(commands)))
            for future in pending:
                conn.check((await conn.wait(future))[0])
        finally:
            await conn.close()

    await asyncio.gather(*(one(e) for e in endpoints))


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
        f"the bare ceiling; then the anti-entropy pass {report.closing_s:.1f} s (divergent "
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
    parser.add_argument("--baseline", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parse_args(parser, keys=3000, value_size=64, writers=2, safety_keys=500)
    if args.baseline:
        baseline(*args.baseline)
        return
    with tempfile.TemporaryDirectory(prefix="replag-rebuild-") as tmp:
        asyncio.run(main_async(args, Path(tmp)))


if __name__ == "__main__":
    main()
