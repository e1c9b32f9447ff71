"""The scan's per-key work: the C scan index against its pure-Python twin.

Indexes batches of 1,000 strings (13-byte names, 1 KB values, as check_ceiling
reads them) both ways, interleaved, and prints ns per key and the ratio.

    python benchmarks/scan_index.py [--keys 1000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.repair.keyspace import native


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parse_args(parser, keys=20000, rounds=1)
    if not native.NATIVE:
        print("replag._scanindex is not built (no compiler at install, or REPLAG_NO_NATIVE)")
        return 1
    batch = 1000
    keys = [b"key:%09d" % i for i in range(batch)]
    values = [os.urandom(1024) for _ in range(batch)]
    batches = max(1, args.keys // batch)
    timings: dict[str, list[float]] = {"C": [], "Python": []}
    for _ in range(args.rounds):
        for name, index in (("C", native.string_index), ("Python", native.string_index_python)):
            start = time.perf_counter()
            for _ in range(batches):
                index(keys, values)
            timings[name].append((time.perf_counter() - start) / (batches * batch) * 1e9)
    c, py = statistics.median(timings["C"]), statistics.median(timings["Python"])
    print(
        f"scan index of {batches * batch:,} strings (13-byte names, 1 KB values), "
        f"{args.rounds} rounds, load {os.getloadavg()[0]:.2f}"
    )
    print(f"  C (replag._scanindex)   median {c:6.1f} ns/key")
    print(f"  Python (numpy, xxhash)  median {py:6.1f} ns/key")
    print(f"  ratio Python / C: {py / c:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
