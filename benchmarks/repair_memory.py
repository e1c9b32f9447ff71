"""Peak memory of `repair check` against collection size: a small check and a 1M-field hash.

Three real replicas hold 20,000 small strings (10 of them divergent); the big
case adds one hash of `--fields` fields (1,000,000 by default) on every
replica, one field different on one of them, so the hash is scanned, found
divergent and verified (read twice on every replica). Each `replag repair
check` runs as a process of its own; its peak RSS comes from wait4(). The
baseline, in the same run, is a process that digests the same hash the way
replag did before streaming digests: every field into a dict, then per-field
hashes sorted. With `--before REV` the same two checks are also run with
replag as it was at commit REV (extracted with `git archive`), e.g. the commit
before streaming digests. Target: the big check within 150 MB.

    python benchmarks/repair_memory.py [--fields 1000000] [--before REV]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)
from runstats import Measured, run_measured

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


def check(config: Path, code_dir: Path | None = None) -> tuple[Measured, int | str]:
    """`replag repair check` of this tree, or of the replag extracted in `code_dir`."""
    env = None if code_dir is None else {**os.environ, "PYTHONPATH": str(code_dir)}
    measured = run_measured(
        [sys.executable, "-m", "replag", "repair", "check", "-c", str(config), "--json"],
        env=env,
        cwd=code_dir,
    )
    code = measured.returncode
    divergent = json.loads(measured.stdout)["divergent"] if code in (0, 1) else measured.stderr
    return measured, divergent


def extract(rev: str, into: Path) -> Path:
    """replag as it was at commit `rev`, extracted under `into`."""
    into.mkdir()
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", rev, "replag"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _line(measured: Measured) -> str:
    return (
        f"peak {measured.tree_rss_mb:.0f} MB (process tree PSS; largest process "
        f"{measured.max_rss_mb:.0f} MB RSS), {measured.seconds:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fields", type=int, default=1_000_000)
    parser.add_argument("--before", metavar="REV", help="also run replag as of this commit")
    args = parse_args(parser, fields=5000)
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
            old = extract(args.before, workdir / "before") if args.before else None
            load(servers, 0)
            small, found = check(config)
            print(f"small check ({STRINGS:,} strings): {_line(small)}, {found} divergent")
            if old is not None:
                measured, found = check(config, old)
                print(f"before ({args.before}): small check: {_line(measured)}, {found} divergent")
            load(servers, args.fields)
            big, found = check(config)
            print(f"check with one {args.fields:,}-field hash: {_line(big)}, {found} divergent")
            before_big: Measured | None = None
            if old is not None:
                before_big, found = check(config, old)
                print(
                    f"before ({args.before}): check with one {args.fields:,}-field hash: "
                    f"{_line(before_big)}, {found} divergent"
                )
            script = workdir / "baseline.py"
            script.write_text(BASELINE)
            base = run_measured([sys.executable, str(script), str(servers[0].port), BIG])
            print(
                "before: baseline digest (every field in a dict, hashes sorted; one replica, "
                f"one read): {_line(base)}"
            )
            print(
                f"ratio: the big check uses {big.tree_rss_mb / small.tree_rss_mb:.2f}x the small "
                f"check's memory and {big.tree_rss_mb / base.tree_rss_mb:.2f}x the baseline's"
                + (
                    f", {big.tree_rss_mb / before_big.tree_rss_mb:.2f}x the check before's"
                    if before_big is not None
                    else ""
                )
                + "; "
                f"target <= 150 MB: {'met' if big.tree_rss_mb <= 150 else 'NOT met'}"
            )
        finally:
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
