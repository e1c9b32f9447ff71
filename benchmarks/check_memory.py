"""A full check's peak memory against the keyspace: 2 replicas × 1M, 3M, 10M keys × 100 B.

Two independent redis-server processes get the same N keys (pipelined MSET,
`replag lab load`), then 1,000 injected divergences (missing, changed, extra,
type, expiry). `replag repair check` runs as its own process tree, once timed
without the memory sampler and once sampled: peak memory is the largest sum
of its processes' PSS (a page shared by a forked scan process and its parent
counts half to each), sampled every 20 ms from /proc; the largest single
process's RSS is printed beside it. Each line carries what the check found
against the injected truth. The marginal bytes per key between two key counts
is the difference of their peaks over the difference of their keys (for the two
replicas together), the fixed size apart: a check whose memory does not grow
with the keyspace shows a marginal near 0 however many keys. With `--rounds R`
every lab stays up and the timed check is run R times per count, interleaved
across the counts (a shared host's load drifts): time per key compares the
medians, wall and CPU. Targets:
peak ≤ `check_memory` (the budget line), marginal ≤ 4 B per key, time per key
no worse at the largest count than at the smallest.

    python benchmarks/check_memory.py [--keys 1000000,3000000,10000000] [--budget-mb 256]
        [--rounds 1]
    python benchmarks/check_memory.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from _smoke import parse_args
from check_ceiling import DEBIAN_REDIS, ServerCpu, compile_bytecode, run_check, topology_of
from runstats import Measured

from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.lab.diverge import DivergeSpec, lab_diverge
from replag.lab.load import LoadSpec, lab_load
from replag.repair.keyspace.observe import key_from_json

TARGET_MARGINAL = 4.0  # bytes per key, 2 replicas together


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1000000,3000000,10000000")
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--budget-mb", type=int, default=None, help="check_memory (MB)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="timed checks per key count, interleaved across the counts (every lab stays "
        "up): time per key compares their medians, which a shared host's load sways less",
    )
    args = parse_args(parser, keys="20000,60000", rounds=2)
    counts = [int(x) for x in args.keys.split(",")]
    if os.access(DEBIAN_REDIS, os.X_OK):
        os.environ.setdefault("REPLAG_REDIS_SERVER", DEBIAN_REDIS)
    print(f"replag's {compile_bytecode()} modules compiled to bytecode, as an install does")
    rows: list[tuple[int, Measured, Measured]] = []
    with contextlib.ExitStack() as labs:
        checks: list[Check] = []
        for n in counts:
            # One round: each lab is down before the next is loaded (10M keys: ~3 GB).
            lab = labs.enter_context(contextlib.ExitStack())
            lab_dir = Path(lab.enter_context(tempfile.TemporaryDirectory(prefix="rb-"))) / "lab"
            state = lab_up(lab_dir, LabSpec(regions=("a", "b"), delays_ms={}, engine="independent"))
            lab.callback(lab_down, lab_dir)
            checks.append(prepare(args, lab_dir, n, [p["pid"] for p in state["processes"]]))
            rows.append((n, *first_runs(args, checks[-1])))
            if args.rounds == 1:
                lab.close()
        timed = {c.n: [row[1]] for c, row in zip(checks, rows, strict=True)}
        for r in range(1, args.rounds):
            for c in checks[r % len(checks) :] + checks[: r % len(checks)]:
                with ServerCpu(c.pids) as servers:
                    measured, found, fp = run_check(
                        c.config, c.store, c.truth, ttls="compare", sample_memory=False
                    )
                c.server_cpu.append(servers.seconds)
                timed[c.n].append(measured)
                load = os.getloadavg()
                print(
                    f"round {r + 1}: {c.n:>11,} keys: check {measured.seconds:.2f} s "
                    f"({measured.seconds / c.n * 1e6:.2f} µs/key), CPU {measured.cpu_s:.1f} s, "
                    f"servers' CPU {servers.seconds:.1f} s, found {found}/{len(c.truth)} "
                    f"fp {fp} (load {load[0]:.2f})",
                    flush=True,
                )
    medians = [(n, median_of(timed[n]), sampled) for n, _, sampled in rows]
    summarize(medians, args.budget_mb, args.rounds)
    if len(checks) > 1:
        (c0, c1) = checks[0], checks[-1]
        s0 = statistics.median(c0.server_cpu) / c0.n * 1e6
        s1 = statistics.median(c1.server_cpu) / c1.n * 1e6
        print(
            f"servers' CPU per key {c0.n:,} -> {c1.n:,} keys (median of {args.rounds}): "
            f"{s0:.2f} -> {s1:.2f} µs ({s1 / s0:.2f}x; the two redis-servers' own work, "
            "which the wall time includes)"
        )
    return 0


@dataclass(frozen=True)
class Check:
    n: int
    seconds_loaded: float
    config: Path
    store: Path
    truth: set[bytes]
    pids: list[int]  # the lab's redis-servers
    server_cpu: list[float] = field(default_factory=list)  # their CPU seconds, per timed run


def prepare(args: argparse.Namespace, lab_dir: Path, n: int, pids: list[int]) -> Check:
    """Load `n` keys into the lab, inject 1,000 divergences, write the check's config."""
    info = lab_load(lab_dir, LoadSpec(keys=n, value_size=args.value_size))
    spec = DivergeSpec(missing=250, changed=250, extra=250, type=125, ttl=125, seed=7)
    injected = lab_diverge(lab_dir, spec, None)
    truth = {key_from_json(d) for d in injected["divergent"]}
    extra = {} if args.budget_mb is None else {"check_memory_mb": args.budget_mb}
    config = topology_of(lab_dir, 2, extra)
    return Check(n, info["seconds"], config, lab_dir / "replag.sqlite", truth, pids)


def first_runs(args: argparse.Namespace, c: Check) -> tuple[Measured, Measured]:
    """The first timed run and the sampled run of a check of `c.n` keys."""
    with ServerCpu(c.pids) as servers:
        timed, found_t, fp_t = run_check(
            c.config, c.store, c.truth, ttls="compare", sample_memory=False
        )
    c.server_cpu.append(servers.seconds)
    load = os.getloadavg()
    sampled, found, fp = run_check(c.config, c.store, c.truth, ttls="compare", sample_memory=True)
    n, truth = c.n, c.truth
    print(
        f"{n:>11,} keys × {args.value_size} B, 2 replicas (loaded in {c.seconds_loaded:.1f} s): "
        f"check {timed.seconds:.2f} s ({timed.seconds / n * 1e6:.2f} µs/key), CPU "
        f"{timed.cpu_s:.1f} s, servers' CPU {servers.seconds:.1f} s, found {found_t}/{len(truth)} "
        f"fp {fp_t}; sampled run "
        f"{sampled.seconds:.2f} s: peak {sampled.tree_rss_mb:.1f} MiB (PSS of the process "
        f"tree; largest process RSS {sampled.max_rss_mb:.1f} MiB), disk written "
        f"{sampled.disk_write_mb:.1f} MB, found {found}/{len(truth)} fp {fp} "
        f"(load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})",
        flush=True,
    )
    return timed, sampled


def median_of(runs: list[Measured]) -> Measured:
    """The run of median wall time, with the median CPU time."""
    by_wall = sorted(runs, key=lambda m: m.seconds)
    cpu = statistics.median(m.cpu_s for m in runs)
    return dataclasses.replace(by_wall[(len(by_wall) - 1) // 2], cpu_s=cpu)


def summarize(
    rows: list[tuple[int, Measured, Measured]], budget_mb: int | None, rounds: int = 1
) -> None:
    for (n0, _, m0), (n1, _, m1) in itertools.pairwise(rows):
        marginal = (m1.tree_rss_mb - m0.tree_rss_mb) * 2**20 / (n1 - n0)
        verdict = "met" if marginal <= TARGET_MARGINAL else "MISSED"
        print(
            f"marginal {n0:,} -> {n1:,} keys: {marginal:+.2f} B per key for 2 replicas "
            f"(≤ {TARGET_MARGINAL:.0f}: {verdict})"
        )
    if len(rows) > 1:
        (n0, t0, m0), (n1, t1, m1) = rows[0], rows[-1]
        marginal = (m1.tree_rss_mb - m0.tree_rss_mb) * 2**20 / (n1 - n0)
        print(f"marginal {n0:,} -> {n1:,} keys: {marginal:+.2f} B per key for 2 replicas")
        # The timed runs (medians of `rounds`): wall time per key (the target), CPU per
        # key beside it (the steadier figure on a shared host).
        wall0, wall1 = t0.seconds / n0 * 1e6, t1.seconds / n1 * 1e6
        cpu0, cpu1 = t0.cpu_s / n0 * 1e6, t1.cpu_s / n1 * 1e6
        verdict = "met" if wall1 <= wall0 else "MISSED"
        print(
            f"time per key {n0:,} -> {n1:,} keys (median of {rounds}): {wall0:.2f} -> "
            f"{wall1:.2f} µs wall "
            f"({wall1 / wall0:.2f}x; no worse at {n1:,}: {verdict}), {cpu0:.2f} -> {cpu1:.2f} "
            f"µs CPU ({cpu1 / cpu0:.2f}x)"
        )
    peak = max(m.tree_rss_mb for _, _, m in rows)
    if budget_mb is not None:
        verdict = "met" if peak <= budget_mb else "MISSED"
        print(f"budget: check_memory {budget_mb} MB; largest peak {peak:.1f} MiB ({verdict})")
    else:
        print(f"budget: check_memory at its default; largest peak {peak:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
