"""`--smoke`: each benchmark's tiny run, the same code path at sizes that take seconds.

tests/test_benchmarks.py runs every benchmark with `--smoke` under a timeout, so a
benchmark that hangs or breaks fails the suite instead of rotting unseen. A smoke
run's figures mean nothing; it says so on its first line.
"""

from __future__ import annotations

import argparse
from typing import Any


def parse_args(parser: argparse.ArgumentParser, **tiny: Any) -> argparse.Namespace:
    """Parse the command line; under `--smoke`, the options named in `tiny` take those values."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, same code path, seconds (the test suite runs this); figures mean nothing",
    )
    args = parser.parse_args()
    if args.smoke:
        for name, value in tiny.items():
            if not hasattr(args, name):
                parser.error(f"--smoke sets {name}, which is not an option of this benchmark")
            setattr(args, name, value)
        shown = ", ".join(f"{k}={v}" for k, v in tiny.items()) or "defaults"
        print(f"smoke run ({shown}): checks the path works; its figures mean nothing", flush=True)
    return args
