"""Repair safety at scale: seeded runs of the Jepsen-style harness under every policy.

Each run starts 3 real replicas, loads versioned keys, injects divergence, lets
writers (another process) drop writes for a while, then runs `repair run`
while they keep writing (SET, DEL, PEXPIREAT, HSET, SADD, ZADD, versioned),
and checks every key on every replica against the history. Prints one line
per run and the totals: keys clobbered by an older value, resurrected after a
delete, with lost writes, and left divergent though the run did not report
them; anomalies on keys with a write whose fan-out took longer than
`repair_settle` are counted apart (the bound repair's safety rests on).

    python benchmarks/repair_safety.py [--runs 21] [--keys 8000] [--rate 40]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from replag.lab.safety.checker import CATEGORIES
from replag.lab.safety.harness import SafetyRun, SafetySpec, run_once

POLICIES = ("quorum", "source:n1", "newest:ts")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="runs in all, policies in turn")
    parser.add_argument("--keys", type=int, default=8000)
    parser.add_argument("--faults", type=int, default=2000)
    parser.add_argument("--writes", type=int, default=20_000, help="flag runs with fewer writes")
    parser.add_argument("--writers", type=int, default=12)
    parser.add_argument(
        "--rate", type=float, default=40.0, help="repair writes/s per replica (newest: half)"
    )
    parser.add_argument("--settle", default="50ms", help="repair_settle")
    parser.add_argument("--policy", action="append", help="only these policies")
    args = parser.parse_args()
    policies = tuple(args.policy or POLICIES)
    runs: list[SafetyRun] = []
    started = time.perf_counter()
    for n in range(args.runs):
        policy = policies[n % len(policies)]
        # newest: decides half its keys as conflicts (sets and sorted sets carry no
        # timestamp) and writes the rest: a slower rate keeps its repair as long as the
        # others', so the writers overlap it as much.
        rate = args.rate / 2 if policy.startswith("newest:") else args.rate
        spec = SafetySpec(
            policy=policy,
            seed=100 + n,
            keys=args.keys,
            faults=args.faults,
            writers=args.writers,
            repair_rate=rate,
            repair_settle=args.settle,
        )
        with tempfile.TemporaryDirectory(prefix="replag-safety-") as workdir:
            run = await run_once(spec, Path(workdir))
        runs.append(run)
        short = "" if run.writes >= args.writes else f"  (fewer than --writes {args.writes})"
        print(run.line() + short, flush=True)
        for example in run.verdict.examples[:3]:
            print(f"    {example}", flush=True)
    print()
    print(
        f"{len(runs)} runs in {time.perf_counter() - started:.0f} s, "
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
        print(
            f"{policy:<10} {len(mine)} runs: clobbered {totals['clobbered']}, "
            f"resurrected {totals['resurrected']}, lost {totals['lost']}, "
            f"falsely fixed {totals['falsely_fixed']}; "
            f"outside the bound {outside} ({slow} writes slower than repair_settle)"
        )


if __name__ == "__main__":
    asyncio.run(main())
