"""Lag through agents against the relay's truth, on asymmetric WAN paths; the central prober beside.

A WAN lab (`lab up --wan --agents`): the primary and the prober in us-east,
eu-west 60 ms out / 100 ms back, ap-south 100 ms out / 60 ms back (±1 ms jitter),
one `replag agent` per region, each agent's clock shifted (eu-west +1 ms,
ap-south −1 ms) and every host stating a 1 ms clock error bound (the lab's
shared clock is unsynchronised to UTC; 1 ms is what chrony on a good source
keeps). Rounds alternate: the same topology probed centrally (agents removed
from the config: push across the WAN, half a round trip subtracted) and through
the agents. Per key the truth is from the moment the primary's link delivered
the write to the primary to the moment the replica's replication link delivered
it to the replica (both stamped by the relays on the shared monotonic clock):
the lag the lab's network gave it, relay wake-ups included, each server's own
processing after delivery on both ends.

Prints per region the central prober's bias and error bar and the agents'
error and bar, the share of samples whose bar holds the truth, and ends with

    lag via agents: p50 error …, within bar …% (central prober bias …)

`measure_lag_via_agents()` returns that line (benchmarks/agents_wan.py calls it).

    python benchmarks/agents_lag.py [--probes 500] [--rounds 2] [--rate 200]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np
from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.config import Config, load_config
from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.lab.relay import read_truth
from replag.probes import run_probe

PATHS = {"eu-west": (60.0, 100.0), "ap-south": (100.0, 60.0)}
OFFSETS_MS = {"eu-west": 1.0, "ap-south": -1.0}
BOUND_MS = 1.0


def _central(config: Config) -> Config:
    regions = tuple(dataclasses.replace(r, agent=None) for r in config.topology.regions)
    return dataclasses.replace(
        config, topology=dataclasses.replace(config.topology, regions=regions)
    )


async def _round(
    config: Config, lab_dir: Path, probes: int, rate: float
) -> dict[str, list[tuple[float, float]]]:
    """Per region: (measured − truth, half-width of the bar) of every sample, in ms."""
    report = await run_probe(config, count=probes, rate=rate, mode="push", timeout_s=10)
    out: dict[str, list[tuple[float, float]]] = {}
    written = read_truth(lab_dir / "truth-write-us-east-primary.log")
    for region in PATHS:
        truth = read_truth(lab_dir / f"truth-{region}-1.log")
        rows = []
        for s in report.samples:
            if s.target != region or s.lag_ns is None:
                continue
            key = f"{config.settings.prefix}{report.run_id}:{s.seq}"
            if key in truth and key in written:
                true_ns = truth[key][1] - written[key][1]
                rows.append(((s.lag_ns - true_ns) / 1e6, s.uncertainty_ns / 1e6))
        out[region] = rows
    return out


def _stats(rows: list[tuple[float, float]]) -> dict[str, float]:
    err = np.array([e for e, _ in rows])
    bar = np.array([b for _, b in rows])
    return {
        "n": float(len(rows)),
        "bias": float(np.median(err)),
        "abs50": float(np.median(np.abs(err))),
        "bar50": float(np.median(bar)),
        "within": float(np.mean(np.abs(err) <= bar) * 100),
    }


async def measure_lag_via_agents(*, probes: int = 500, rounds: int = 2, rate: float = 200) -> str:
    """Run the comparison; print the table; return the summary line."""
    with tempfile.TemporaryDirectory(prefix="replag-bench-") as tmp:
        lab_dir = Path(tmp) / "lab"
        lab_up(
            lab_dir,
            LabSpec(
                regions=("us-east", *PATHS),
                delays_ms={r: p[0] for r, p in PATHS.items()},
                back_ms={r: p[1] for r, p in PATHS.items()},
                jitter_ms=1.0,
                wan=True,
                agents=True,
                agent_clock_offsets_ms=OFFSETS_MS,
                clock_error_bound_ms=BOUND_MS,
            ),
        )
        try:
            config = load_config(lab_dir / "topology.toml")
            central = _central(config)
            rows: dict[str, dict[str, list[tuple[float, float]]]] = {
                "central": {r: [] for r in PATHS},
                "agents": {r: [] for r in PATHS},
            }
            for _ in range(rounds):
                for how, cfg in (("central", central), ("agents", config)):
                    for region, got in (await _round(cfg, lab_dir, probes, rate)).items():
                        rows[how][region] += got
        finally:
            lab_down(lab_dir)
    print(
        f"lag via agents: {rounds} rounds × {probes} probes at {rate:g}/s per method, push; "
        f"WAN from us-east (out/back ms): {PATHS}, ±1 ms jitter; agent clocks shifted "
        f"{OFFSETS_MS} ms; every host states a {BOUND_MS:g} ms clock error bound"
    )
    print(
        f"{'region':<9} {'path':>9} | {'n':>5} {'central bias':>12} {'±bar p50':>9} "
        f"{'within':>7} | {'n':>5} {'agents |err| p50':>16} {'bias':>7} {'±bar p50':>9} "
        f"{'within':>7}"
    )
    agents_all: list[tuple[float, float]] = []
    biases = []
    for region, (out_ms, back_ms) in PATHS.items():
        c, a = _stats(rows["central"][region]), _stats(rows["agents"][region])
        agents_all += rows["agents"][region]
        biases.append(f"{c['bias']:+.1f} ms {region}")
        print(
            f"{region:<9} {f'{out_ms:g}/{back_ms:g}':>9} | {c['n']:>5.0f} {c['bias']:>+12.3f} "
            f"{c['bar50']:>9.3f} {c['within']:>6.1f}% | {a['n']:>5.0f} {a['abs50']:>16.3f} "
            f"{a['bias']:>+7.3f} {a['bar50']:>9.3f} {a['within']:>6.1f}%"
        )
    total = _stats(agents_all)
    target = "met" if total["within"] >= 99.0 else "MISSED"
    print(f"target: ≥ 99% of samples with the truth inside their bar: {target}")
    line = (
        f"lag via agents: p50 error {total['abs50']:.3f} ms, within bar "
        f"{total['within']:.1f}% (central prober bias {', '.join(biases)})"
    )
    print(line)
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200)
    args = parse_args(parser, probes=20, rounds=1)
    asyncio.run(measure_lag_via_agents(probes=args.probes, rounds=args.rounds, rate=args.rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
