"""Repair safety at scale: seeded runs of the Jepsen-style harness under every policy.

Each run starts 3 real replicas, loads versioned keys, injects divergence, lets
writers (another process) drop writes for a while, then runs `repair run`
while they keep writing (SET, DEL, PEXPIREAT, HSET, SADD, ZADD, versioned),
and checks every key on every replica against the history. Prints one line
per run and the totals: keys clobbered by an older value, resurrected after a
delete, with lost writes, and left divergent though the run did not report
them; anomalies on keys where a write whose fan-out took longer than
`repair_settle` (the bound repair's safety rests on) was still under way while
the repair read or wrote that key (the servers' MONITOR says when) are counted
apart.

A run with fewer than `--writes` writes during its repair is printed and
counted in the totals but not towards `--runs`; its policy's later runs
repair more slowly.

    python benchmarks/repair_safety.py [--runs 21] [--keys 8000] [--rate 40]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.lab.safety.checker import CATEGORIES
from replag.lab.safety.harness import SafetyRun, SafetySpec, run_once

POLICIES = ("quorum", "source:n1", "newest:ts")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=21, help="runs with >= --writes writes, policies in turn"
    )
    parser.add_argument("--keys", type=int, default=8000)
    parser.add_argument("--faults", type=int, default=2000)
    parser.add_argument("--writes", type=int, default=20_000, help="writes a run must see")
    parser.add_argument("--writers", type=int, default=12)
    parser.add_argument(
        "--rate", type=float, default=40.0, help="repair writes/s per replica (newest: / 2.5)"
    )
    parser.add_argument("--settle", default="50ms", help="repair_settle")
    parser.add_argument("--policy", action="append", help="only these policies")
    args = parse_args(parser, runs=1, keys=300, faults=60, writes=500, writers=2)
    policies = tuple(args.policy or POLICIES)
    # newest: decides half its keys as conflicts (sets and sorted sets carry no
    # timestamp) and writes the rest: a slower rate keeps its repair as long as the
    # others', so the writers overlap it as much.
    rates = {p: args.rate / 2.5 if p.startswith("newest:") else args.rate for p in policies}
    runs: list[SafetyRun] = []
    full = 0  # runs with at least --writes writes during the repair
    started = time.perf_counter()
    n = 0
    while full < args.runs and n < 2 * args.runs:
        policy = policies[n % len(policies)]
        spec = SafetySpec(
            policy=policy,
            seed=100 + n,
            keys=args.keys,
            faults=args.faults,
            writers=args.writers,
            repair_rate=rates[policy],
            repair_settle=args.settle,
        )
        n += 1
        with tempfile.TemporaryDirectory(prefix="replag-safety-") as workdir:
            run = await run_once(spec, Path(workdir))
        runs.append(run)
        note = ""
        if run.writes >= args.writes:
            full += 1
        else:
            # Its figures count; it does not count towards --runs, and this policy's
            # next runs repair more slowly, so the writers overlap them longer.
            rates[policy] *= max(0.5, 0.9 * run.writes / args.writes)
            note = f"  (fewer than --writes {args.writes}: not counted in --runs)"
        print(run.line() + note, flush=True)
        for example in run.verdict.examples[:3]:
            print(f"    {example}", flush=True)
    print()
    print(
        f"{len(runs)} runs ({full} with >= {args.writes:,} writes during repair) in "
        f"{time.perf_counter() - started:.0f} s, "
        f"{sum(r.writes for r in runs):,} writes during repair "
        f"(fewest in a run {min(r.writes for r in runs):,}), "
        f"{sum(r.report['repaired'] for r in runs):,} keys repaired, "
        f"{sum(r.report['undone'] for r in runs):,} copies undone"
    )
    for policy in policies:
        mine = [r for r in runs if r.spec.policy == policy]
        totals = {c: sum(r.verdict.counts[c] for r in mine) for c in CATEGORIES}
        outside = sum(r.verdict.outside_bound for r in mine)
        slow = sum(r.slow_ops for r in mine)
        met = sum(r.slow_during_repair for r in mine)
        print(
            f"{policy:<10} {len(mine)} runs: clobbered {totals['clobbered']}, "
            f"resurrected {totals['resurrected']}, lost {totals['lost']}, "
            f"falsely fixed {totals['falsely_fixed']}; "
            f"outside the bound {outside} ({slow} writes slower than repair_settle, "
            f"{met} of them still fanning out while the repair read or wrote their key)"
        )


if __name__ == "__main__":
    asyncio.run(main())
