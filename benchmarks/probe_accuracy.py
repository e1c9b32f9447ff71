"""How close are replag's lag percentiles to the truth?

Runs the lab at one-way delays of 1, 10 and 80 ms (no jitter), 500 probes per
case, in push and in poll mode. The truth of each probe key's lag comes from the
servers themselves: MONITOR on the source and on the far replica stamps the
moment each ran the key's SET, to the microsecond, on the host's clock
(`monitor_truth.py`). That includes the replica's own delay in running what it
received, which the delay relay's log (when the bytes entered and left it)
misses: under CPU load a replica preempted for milliseconds applies the key that
much later, and the probe is right to say so. A sample's error is its distance
from the truth. Prints, per case, measured p50/p99 against the true p50/p99 and
the error, plus the dynomite-seed method's average.

With `--load N`, every case runs twice: on the machine as it is, then with N
processes burning CPU (at normal priority) for the length of the measurement,
and both tables are printed. Per-sample errors are also checked against the
uncertainty each sample reports: a sample whose error exceeds its own
uncertainty by more than 0.5 ms is counted ("over unc"; "(relay)": the same
count against the relay's bracket instead, for comparison).

    python benchmarks/probe_accuracy.py [--probes 500] [--delays 1,10,80] [--rate 200] [--load N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from monitor_truth import MonitorTap, apply_moments

from replag.config import load_config
from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.lab.relay import read_truth_brackets
from replag.probes.runner import run_probe
from replag.probes.seed_method import run_seed_method

EXCESS_MS = 0.5


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


@contextlib.contextmanager
def cpu_burners(n: int) -> Iterator[None]:
    """`n` processes spinning on the CPU until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


async def one_case(
    lab_dir: Path, delay_ms: float, mode: str, probes: int, rate: float, load: int
) -> dict:
    config = load_config(lab_dir / "topology.toml")
    near = next(r for r in config.topology.regions if r.write is not None)
    far = next(e for r in config.topology.regions for e in r.replicas if e.name == "far-1")
    assert near.write is not None
    taps = [
        MonitorTap(e.host, e.port, lab_dir / f"monitor-{e.name}-{mode}-{load}.log")
        for e in (near.write, far)
    ]
    try:
        with cpu_burners(load):
            report = await run_probe(config, count=probes, mode=mode, rate=rate, timeout_s=5)
            seed = await run_seed_method(config, source="near", repeats=5)
    finally:
        for tap in taps:
            tap.stop()
    prefix = config.settings.prefix
    applied_source, applied_far = (apply_moments(tap.path, prefix) for tap in taps)
    relay = read_truth_brackets(lab_dir / "truth-far-1.log")
    measured, true, errors, excess, relay_excess = [], [], [], [], []
    for sample in report.samples:
        if sample.replica != "far-1" or sample.lag_ns is None:
            continue
        key = f"{prefix}{report.run_id}:{sample.seq}"
        if key not in applied_source or key not in applied_far:
            continue
        # The truth: the replica ran the key's SET this long after the source did, both
        # moments stamped by the servers themselves (MONITOR) on the host's clock.
        truth_ns = applied_far[key] - applied_source[key]
        unc_ms = sample.uncertainty_ns / 1e6
        measured.append(sample.lag_ns / 1e6)
        true.append(truth_ns / 1e6)
        errors.append(abs(sample.lag_ns - truth_ns) / 1e6)
        excess.append(errors[-1] - unc_ms)
        if key in relay:
            # The relay's bracket: when the bytes entered and left it (before the replica
            # read and ran them, so it misses the replica's own delay).
            t_in, out_from, out_by = relay[key]
            off = max(out_from - t_in - sample.lag_ns, sample.lag_ns - (out_by - t_in), 0)
            relay_excess.append(off / 1e6 - unc_ms)
    seed_avg = statistics.mean(r["avg_ms"] for r in seed if r["replica"] == "far-1")
    pair = next(p for p in report.pairs if p.replica == "far-1")
    return {
        "delay": delay_ms,
        "mode": mode,
        "n": len(measured),
        "lost": pair.lost,
        "m50": pct(measured, 50),
        "t50": pct(true, 50),
        "m99": pct(measured, 99),
        "t99": pct(true, 99),
        "abs_err_p50": pct(errors, 50),
        "abs_err_p99": pct(errors, 99),
        "over_unc": sum(1 for e in excess if e > EXCESS_MS),
        "max_excess": max(excess),
        "relay_over": sum(1 for e in relay_excess if e > EXCESS_MS),
        "seed": seed_avg,
        "unc50": pair.summary.uncertainty_ms["p50"],
    }


def table(rows: list[dict], title: str) -> None:
    print(title)
    print(
        f"{'delay':>6} {'mode':<5} {'n':>4} {'lost':>4} | {'p50 meas':>9} {'p50 true':>9} "
        f"{'p50 err':>8} | {'p99 meas':>9} {'p99 true':>9} {'p99 err':>8} | "
        f"{'|err| med':>9} {'|err| p99':>9} {'±unc p50':>9} {'over unc':>8} {'(relay)':>7} | "
        f"{'seed avg':>9} {'seed err':>9}"
    )
    for r in rows:
        print(
            f"{r['delay']:>6g} {r['mode']:<5} {r['n']:>4} {r['lost']:>4} | "
            f"{r['m50']:>9.3f} {r['t50']:>9.3f} {r['m50'] - r['t50']:>+8.3f} | "
            f"{r['m99']:>9.3f} {r['t99']:>9.3f} {r['m99'] - r['t99']:>+8.3f} | "
            f"{r['abs_err_p50']:>9.3f} {r['abs_err_p99']:>9.3f} {r['unc50']:>9.3f} "
            f"{r['over_unc']:>8} {r['relay_over']:>7} | "
            f"{r['seed']:>9.3f} {r['seed'] - r['t50']:>+9.3f}"
        )
    push = [r for r in rows if r["mode"] == "push"]
    ok50 = all(abs(r["m50"] - r["t50"]) <= 0.2 for r in push)
    ok99 = all(abs(r["m99"] - r["t99"]) <= 0.5 for r in push)
    honest = all(r["over_unc"] == 0 for r in rows)
    worst = max(r["max_excess"] for r in rows)
    print(
        f"targets (push): p50 error ≤ 0.2 ms: {'met' if ok50 else 'MISSED'}; "
        f"p99 error ≤ 0.5 ms: {'met' if ok99 else 'MISSED'}; "
        f"(push and poll) no sample over its uncertainty by > {EXCESS_MS} ms: "
        f"{'met' if honest else 'MISSED'} (worst {worst:+.3f} ms)"
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=500)
    parser.add_argument("--delays", default="1,10,80")
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument(
        "--load", type=int, default=0, help="also run every case beside N CPU-burning processes"
    )
    args = parser.parse_args()
    loads = [0, args.load] if args.load else [0]
    rows: dict[int, list[dict]] = {n: [] for n in loads}
    system_load: dict[int, list[float]] = {n: [] for n in loads}
    for delay in (float(d) for d in args.delays.split(",")):
        with tempfile.TemporaryDirectory(prefix="replag-bench-") as tmp:
            lab_dir = Path(tmp) / "lab"
            lab_up(lab_dir, LabSpec(regions=("near", "far"), delays_ms={"far": delay}))
            try:
                for mode in ("push", "poll"):
                    for n in loads:
                        case = await one_case(lab_dir, delay, mode, args.probes, args.rate, n)
                        rows[n].append(case)
                        system_load[n].append(os.getloadavg()[0])
            finally:
                lab_down(lab_dir)
    for n in loads:
        table(
            rows[n],
            f"probe accuracy, {n} CPU burners on {os.cpu_count()} cores (1-min load "
            f"{min(system_load[n]):.1f}–{max(system_load[n]):.1f}): {args.probes} probes per "
            f"case at {args.rate:g}/s, no jitter; truth = the servers' own apply moments "
            "(MONITOR); errors in ms",
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
