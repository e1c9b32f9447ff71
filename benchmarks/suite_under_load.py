"""The multi-process tests on a busy host: the HA, outage and failover tests run N times in
a row beside CPU burners (`python3 -c 'while 1: pass'`, one per `--burners`), counting
passes per test.

Not in CI: it takes about 4-6 minutes a round on 2 cores. A test that passes alone on a
quiet host and fails here is a test (or a product) that cannot tell a slow host from a
fault. Each round is one pytest process over the tests, without xdist; the load average is
printed beside every round, since a shared host's other work counts too. A failed round's
output (with the tails of the instances' logs, `tests/helpers/process_logs.py`) is kept
under `--keep`.

    nice python3 benchmarks/suite_under_load.py --runs 20
    nice python3 benchmarks/suite_under_load.py --runs 5 --tests tests/service/test_ha.py

The burners run at the niceness of this script (start it under `nice` and the tests and
burners share the host alike).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/service/test_ha.py",
    "tests/service/test_ha_outage.py",
    "tests/service/test_outage.py",
    "tests/cli/test_failover_check.py",
]
# A quick test of the same machinery (a store's leases on SQLite), for --smoke.
SMOKE_TESTS = ["tests/store/test_leases.py::test_racing_instances_get_one_lease[sqlite]"]
_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@contextlib.contextmanager
def burners(n: int) -> Iterator[None]:
    procs = [
        subprocess.Popen([sys.executable, "-c", "while 1: pass"], stdin=subprocess.DEVNULL)
        for _ in range(n)
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def one_round(tests: list[str], keep: Path, index: int) -> tuple[dict[str, str], float, str]:
    """Run the tests once: ({test id: outcome}, seconds, pytest's last line)."""
    started = time.monotonic()
    out = keep / f"round-{index:02d}.txt"
    # Its own pytest: nothing of a pytest this runs under (xdist's worker) carries over.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    with out.open("w") as f:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:randomly", "-p",
             "no:cacheprovider", "--basetemp", str(keep / f"tmp-{index:02d}"), *tests],
            cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, check=False,
        )  # fmt: skip
    seconds = time.monotonic() - started
    text = out.read_text(errors="replace")
    outcomes = {}
    for line in text.splitlines():
        if m := _OUTCOME.match(line):
            outcomes[m.group(2)] = m.group(1)
    last = text.strip().splitlines()[-1] if text.strip() else f"exit {done.returncode}"
    if done.returncode == 0 and all(v == "PASSED" for v in outcomes.values()):
        out.unlink()  # nothing to look at
        shutil.rmtree(keep / f"tmp-{index:02d}", ignore_errors=True)
    return outcomes, seconds, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="rounds in a row (default 20)")
    parser.add_argument("--burners", type=int, default=2, help="CPU burners beside them")
    parser.add_argument("--tests", nargs="+", default=TESTS, help="pytest paths or ids")
    parser.add_argument("--keep", type=Path, default=None, help="where failed rounds go")
    args = parse_args(parser, runs=1, burners=1, tests=SMOKE_TESTS)
    keep = args.keep or Path(tempfile.mkdtemp(prefix="suite-under-load-"))
    keep.mkdir(parents=True, exist_ok=True)
    print(f"{args.runs} rounds of {' '.join(args.tests)} beside {args.burners} CPU burners "
          f"on {os.cpu_count()} cores; failed rounds kept in {keep}", flush=True)  # fmt: skip
    passes: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    clean = 0
    with burners(args.burners):
        for i in range(1, args.runs + 1):
            before = load()
            outcomes, seconds, last = one_round(args.tests, keep, i)
            for test, outcome in outcomes.items():
                seen[test] += 1
                passes[test] += outcome == "PASSED"
            failed = sorted(t for t, o in outcomes.items() if o in ("FAILED", "ERROR"))
            clean += not failed and bool(outcomes)
            print(f"round {i}/{args.runs}: load {before} → {load()}, {seconds:.0f} s: {last}"
                  + "".join(f"\n  {o} {t}" for t in failed for o in [outcomes[t]]),
                  flush=True)  # fmt: skip
    print(f"rounds with every test passing: {clean}/{args.runs}")
    for test in sorted(seen):
        print(f"  {passes[test]}/{seen[test]} passed  {test}")


if __name__ == "__main__":
    main()
