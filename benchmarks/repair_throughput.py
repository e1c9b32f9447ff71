"""Anti-entropy throughput: 3 independent replicas × N keys × 1 KB, 1,000 injected divergences.

Prints scan keys/s per replica, check and repair wall time, found/expected and
false positives against the injected ground truth, peak memory, and a naive
baseline (SCAN + GET every key on every replica, compared in Python) run in a
subprocess on the same data, with the ratio. After `repair run`, `repair
check` must find nothing. Numbers are wall-clock on whatever machine runs it.

    python benchmarks/repair_throughput.py [--keys 1000000] [--value-size 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.config import Config, load_config
from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.lab.diverge import DivergeSpec, lab_diverge
from replag.lab.load import LoadSpec, lab_load
from replag.repair import check, repair
from replag.repair.keyspace.observe import key_from_json
from replag.repair.runs import RunLog
from replag.store import Store


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def naive(ports: list[int]) -> None:
    """The baseline: every value of every replica into a dict, then compare."""
    started = time.perf_counter()
    replicas: list[dict[bytes, tuple[bytes | None, int]]] = []
    per_replica = []
    for port in ports:
        t0 = time.perf_counter()
        client = redis.Redis(port=port)
        values: dict[bytes, tuple[bytes | None, int]] = {}
        cursor = 0
        while True:
            cursor, keys = client.scan(cursor, count=1000)
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
            answers = pipe.execute(raise_on_error=False)
            for i, key in enumerate(keys):
                value = answers[2 * i]
                values[key] = (value if isinstance(value, bytes) else None, answers[2 * i + 1])
            if cursor == 0:
                break
        per_replica.append(len(values) / (time.perf_counter() - t0))
        replicas.append(values)
        client.close()
    everything = set().union(*replicas)
    differing = sum(
        1
        for k in everything
        if len({(r.get(k, (b"<absent>", 0))[0], r.get(k, (None, 0))[1] >= 0) for r in replicas}) > 1
    )
    print(
        json.dumps(
            {
                "seconds": time.perf_counter() - started,
                "differing": differing,
                "keys_per_s": per_replica,
                "peak_rss_mb": rss_mb(),
            }
        )
    )


def with_settings(config: Config, **values: object) -> Config:
    return dataclasses.replace(config, settings=config.settings.replace(**values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-size", type=int, default=1024)
    parser.add_argument("--naive", nargs="*", type=int, help=argparse.SUPPRESS)
    args = parse_args(parser, keys=3000, value_size=64)
    if args.naive:
        naive(args.naive)
        return
    with tempfile.TemporaryDirectory(prefix="replag-bench-") as tmp:
        lab_dir = Path(tmp) / "lab"
        state = lab_up(
            lab_dir, LabSpec(regions=("a", "b", "c"), delays_ms={}, engine="independent")
        )
        try:
            run(lab_dir, [p["port"] for p in state["processes"]], args)
        finally:
            lab_down(lab_dir)


def run(lab_dir: Path, ports: list[int], args: argparse.Namespace) -> None:
    print(f"3 independent redis-server replicas × {args.keys:,} keys × {args.value_size} B")
    info = lab_load(lab_dir, LoadSpec(keys=args.keys, value_size=args.value_size))
    print(f"load: {info['seconds']:.1f} s (pipelined, all replicas at once)")
    truth = lab_diverge(
        lab_dir,
        DivergeSpec(missing=250, changed=250, extra=250, type=125, ttl=125, seed=7),
        lab_dir / "truth.json",
    )
    expected = {key_from_json(d): d["kind"] for d in truth["divergent"]}
    print(f"injected: {truth['total']} divergent keys {truth['counts']}")

    # One replica at a time: on this 2-core machine each scan then has a core for
    # redis-server and one for us; scan_parallel=0 scans all three at once.
    config = with_settings(
        load_config(lab_dir / "topology.toml"), scan_parallel=1, repair_settle="50ms"
    )
    rss_before = rss_mb()
    t0 = time.perf_counter()
    store = Store(lab_dir / "bench.sqlite")
    found_report = asyncio.run(check(config, store=store))
    check_s = time.perf_counter() - t0
    rss_after_check = rss_mb()
    found = found_report.to_dict()
    for r in found["replicas"]:
        print(
            f"scan {r['replica']}: {r['keys_scanned']:,} keys in {r['scan_s']:.2f} s = "
            f"{r['keys_per_s']:,} keys/s"
        )
    # Every divergent key (not just the report's capped list) is in the store.
    found_keys = {k: kind for k, kind, _, _ in RunLog(store, found_report.run_id).keys("lab")}
    hits = sum(1 for k, kind in found_keys.items() if expected.get(k) == kind)
    false_positives = len(found_keys) - hits
    missed = sum(1 for k in expected if k not in found_keys)
    print(
        f"check: {check_s:.2f} s total; found {hits} / expected {len(expected)} "
        f"(same key, same kind); false positives {false_positives}; missed {missed}; "
        f"by kind {found['counts']}"
    )
    print(f"peak RSS: {rss_after_check:.0f} MB after check (was {rss_before:.0f} MB before)")

    proc = subprocess.run(
        [sys.executable, __file__, "--naive", *map(str, ports)],
        capture_output=True,
        text=True,
        check=True,
    )
    baseline = json.loads(proc.stdout)
    rates = ", ".join(f"{r:,.0f}" for r in baseline["keys_per_s"])
    print(
        f"naive baseline (SCAN + pipelined GET/PTTL of every key, compared in Python): "
        f"{baseline['seconds']:.1f} s, {rates} keys/s per replica, "
        f"{baseline['differing']} differing keys, peak RSS {baseline['peak_rss_mb']:.0f} MB"
    )
    print(f"ratio: check is {baseline['seconds'] / check_s:.1f}× faster than the naive baseline")

    t0 = time.perf_counter()
    fixed = asyncio.run(repair(config)).to_dict()
    repair_s = time.perf_counter() - t0
    print(
        f"repair run: {repair_s:.2f} s total; repaired {fixed['repaired']}, conflicts "
        f"{fixed['conflicts']}, busy {fixed['busy']}, undone {fixed['undone']}, "
        f"writes {sum(r['writes'] for r in fixed['replicas'])}"
    )
    again = asyncio.run(check(config)).to_dict()
    print(f"check after repair: {again['divergent']} divergent keys")


if __name__ == "__main__":
    main()
