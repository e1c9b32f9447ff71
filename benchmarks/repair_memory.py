"""Peak memory of `repair check` against collection size: a small check and a 1M-field hash.

Three real replicas hold 20,000 small strings (10 of them divergent); the big
case adds one hash of `--fields` fields (1,000,000 by default) on every
replica, one field different on one of them, so the hash is scanned, found
divergent and verified (read twice on every replica). Each `replag repair
check` runs as a process of its own; its peak RSS comes from wait4(). The
baseline, in the same run, is a process that digests the same hash the way
replag did before streaming digests: every field into a dict, then per-field
hashes sorted. Target: the big check within 150 MB.

    python benchmarks/repair_memory.py [--fields 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replag.lab.server import RedisServer, free_port

BIG = "big:hash"
STRINGS = 20_000

BASELINE = """
import sys, numpy as np, redis, xxhash
r = redis.Redis(port=int(sys.argv[1]))
fields, cursor = {}, 0
while True:
    cursor, page = r.hscan(sys.argv[2], cursor, count=1000)
    fields.update(page)
    if cursor == 0:
        break
h = xxhash.xxh3_64_intdigest
names = np.fromiter(map(h, fields.keys()), dtype=np.uint64, count=len(fields))
values = np.fromiter(map(h, fields.values()), dtype=np.uint64, count=len(fields))
print(int(h(np.sort(names ^ values).tobytes())), len(fields))
"""


def peak_rss_mb(args: list[str], out: Path) -> tuple[float, float, int]:
    """(peak RSS in MB, seconds, exit code) of one child process, from wait4()."""
    started = time.perf_counter()
    with out.open("wb") as fh:
        process = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024, time.perf_counter() - started, process.returncode


def load(servers: list[RedisServer], fields: int) -> None:
    for i, server in enumerate(servers):
        with server.client() as client:
            pipe = client.pipeline(transaction=False)
            for k in range(STRINGS):
                value = b"%d" % k + b"." * 1000
                pipe.set(b"s:%06d" % k, value if i < 2 or k % 2000 else b"differs")
            pipe.execute()
            for start in range(0, fields, 10_000):
                mapping = {
                    b"f%07d" % f: b"value-%d" % f for f in range(start, min(fields, start + 10_000))
                }
                if i == 2 and start == 0:
                    mapping[b"f0000000"] = b"the odd one"
                pipe.hset(BIG, mapping=mapping)
                if len(pipe) >= 20:
                    pipe.execute()
            pipe.execute()


def check(config: Path, workdir: Path, name: str) -> tuple[float, float, int]:
    out = workdir / f"{name}.json"
    rss, seconds, code = peak_rss_mb(
        [sys.executable, "-m", "replag", "repair", "check", "-c", str(config), "--json"], out
    )
    divergent = json.loads(out.read_text())["divergent"] if code in (0, 1) else out.read_text()
    return rss, seconds, divergent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fields", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="replag-memory-") as tmp:
        workdir = Path(tmp)
        servers = [RedisServer(f"m{i}", free_port(), workdir / "redis").start() for i in range(3)]
        try:
            regions = "".join(
                f'[[regions]]\nname = "r{i}"\nreplicas = [{{name = "n{i}", url = "{s.url}"}}]\n'
                for i, s in enumerate(servers)
            )
            config = workdir / "replag.toml"
            config.write_text(
                f'[settings]\nstore = "{workdir / "s.sqlite"}"\n\n{regions}'
                '[[groups]]\nname = "g"\nmembers = ["n0", "n1", "n2"]\n'
            )
            load(servers, 0)
            small = check(config, workdir, "small")
            print(
                f"small check ({STRINGS:,} strings): peak RSS {small[0]:.0f} MB, "
                f"{small[1]:.1f} s, {small[2]} divergent"
            )
            load(servers, args.fields)
            big = check(config, workdir, "big")
            print(
                f"check with one {args.fields:,}-field hash: peak RSS {big[0]:.0f} MB, "
                f"{big[1]:.1f} s, {big[2]} divergent"
            )
            script = workdir / "baseline.py"
            script.write_text(BASELINE)
            base = peak_rss_mb(
                [sys.executable, str(script), str(servers[0].port), BIG], workdir / "base.out"
            )
            print(
                f"baseline (every field in a dict, hashes sorted; one replica, one read): "
                f"peak RSS {base[0]:.0f} MB, {base[1]:.1f} s"
            )
            print(
                f"ratio: the big check uses {big[0] / small[0]:.2f}x the small check's memory "
                f"and {big[0] / base[0]:.2f}x the baseline's; target <= 150 MB: "
                f"{'met' if big[0] <= 150 else 'NOT met'}"
            )
        finally:
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
