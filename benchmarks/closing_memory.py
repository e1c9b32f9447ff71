"""The rebuild's closing pass: the peak of its per-key state, held against spilled.

A rebuild keeps the 8-byte hash of every key the source's scan returned
(`replag.repair.bulk.source_keys.SourceKeys`) so its closing pass can ask whether
the scan returned a key twice (`repeats`) and which keys another peer holds that
the source lacks (`lacks`). Its share is `check_memory_mb // 4` (64 MB at the
default 256, 8M keys); past it the hashes are sorted and spilled to a private
temporary file. For each key count, two processes of their own: one with a share
larger than the keyspace (everything held: what the code did before the spill,
and still does below the share) and one with `--share-mb` (spilled). Each adds
the names a scan returns, 1,000 at a time (`key:<n>`, the names of
`replag lab load`), then runs `repeats()` and `lacks()` of 100,000 names of which
half the source holds. Printed per process: its peak RSS beyond its RSS before
the first key (VmHWM from /proc, which includes numpy's transients: the sort's
copy, the diff), per key, the disk spilled and the seconds of the closing pass's
two questions. Target: the spilled peak within the share plus a fixed part
(≤ share + 16 MB), whatever the key count.

    python benchmarks/closing_memory.py [--keys 3000000,10000000] [--share-mb 16]
    python benchmarks/closing_memory.py --smoke   # tiny sizes: the suite's run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _smoke import parse_args

FIXED_MB = 16  # the worker: its 100,000 names asked, numpy


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(keys: int, share_bytes: int) -> None:
    from replag.repair.bulk.source_keys import SourceKeys

    batch = [f"key:{i}".encode() for i in range(1000)]  # warm the hashing path
    probe = SourceKeys(memory_bytes=1 << 20)
    probe.add(batch)
    probe.close()
    before = _vm("VmRSS")
    # Reset the high-water mark to now (Linux: 5 to clear_refs).
    Path("/proc/self/clear_refs").write_text("5")
    print("ready", file=sys.stderr, flush=True)
    time.sleep(0.05)  # the parent's first reading
    held = SourceKeys(memory_bytes=share_bytes)
    started = time.perf_counter()
    for first in range(0, keys, 1000):
        held.add([f"key:{i}".encode() for i in range(first, min(keys, first + 1000))])
    added = time.perf_counter() - started
    started = time.perf_counter()
    repeats = held.repeats()
    others = [f"key:{i}".encode() for i in range(keys - 50_000, keys + 50_000)]
    lacks = len(held.lacks(others))
    closing = time.perf_counter() - started
    peak = _vm("VmHWM") - before
    spilled = held.spilled_bytes
    held.close()
    print(
        json.dumps(
            {"peak": peak, "spilled": spilled, "added_s": added, "closing_s": closing,
             "repeats": repeats, "lacks": lacks}
        )
    )  # fmt: skip


def _anon(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return None


def run(keys: int, share_bytes: int) -> dict[str, float]:
    """The worker's figures, and its anonymous memory's peak (sampled every 5 ms from
    here) beyond its reading when it starts adding keys (its stderr's `ready`)."""
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--worker", str(keys), str(share_bytes)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None and proc.stdout is not None
    if proc.stderr.readline().strip() != "ready":
        raise SystemExit(f"worker failed: {proc.stderr.read()[-800:]}")
    start = _anon(proc.pid) or 0
    peak = start
    while proc.poll() is None:
        now = _anon(proc.pid)
        if now is not None:
            peak = max(peak, now)
        time.sleep(0.005)
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"worker failed: {proc.stderr.read()[-800:]}")
    result: dict[str, float] = json.loads(out)
    result["anon_peak"] = peak - start
    return result


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="3000000,10000000")
    parser.add_argument("--share-mb", type=int, default=16)
    args = parse_args(parser, keys="20000,60000", share_mb=0)
    share = max(64 << 10, args.share_mb << 20)
    worst = 0.0
    for n in (int(x) for x in args.keys.split(",")):
        for label, share_bytes in (("held", 8 * n + (1 << 30)), ("spilled", share)):
            r = run(n, share_bytes)
            if label == "spilled":
                worst = max(worst, r["anon_peak"])
            print(
                f"{n:>11,} keys, {label:7s} (share {share_bytes / 2**20:,.0f} MiB): peak "
                f"anonymous {r['anon_peak'] / 2**20:6.1f} MiB ({r['anon_peak'] / n:4.1f} B per "
                f"key), peak RSS {r['peak'] / 2**20:6.1f} MiB (VmHWM: with the spill's "
                f"page-cache pages mapped), spilled "
                f"{r['spilled'] / 1e6:6.1f} MB; closing pass's repeats + lacks of 100,000 "
                f"names {r['closing_s']:.2f} s (repeats {r['repeats']}, lacks {int(r['lacks']):,})"
                f", adding {r['added_s']:.1f} s; load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    bound = share / 2**20 + FIXED_MB
    print(
        f"largest spilled anonymous peak {worst / 2**20:.1f} MiB against share + {FIXED_MB} MiB = "
        f"{bound:.0f} MiB: {'met' if worst / 2**20 <= bound else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
