"""What sampling replication state costs, and how close together the offsets are read.

Lab: one primary, 3 regions × 2 replicas (6 replicas). Per case, N samples:

* replag's sampler with its connections kept (the service): commands and
  round trips per sample, time per sample, and the read skew (the window in
  which the primary's two reads and every replica's read fell);
* the same with fresh connections per sample (what one cron probe run pays);
* baseline, as an exporter scrape reads it: redis-py `INFO replication` of
  each server, one after another, on kept clients; its read window is the
  time from the first answer's request to the last one's answer.

Then the same while a writer streams SETs into the primary: the bytes the
primary wrote inside each read window are the error of a bytes-behind figure
(replag reports it as ± half of it; the baseline cannot say).

    python benchmarks/replication_sampling.py [--samples 200]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import redis
from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.config import load_config
from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.replication import ReplicationSampler, replication_targets


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


_OPPOSITE = {"tighter": "looser", "faster": "slower", "smaller": "larger"}


def compared(baseline: float, ours: float, better: str) -> str:
    """'1.7× tighter', or '1.3× looser' when the baseline did better in this run."""
    if ours <= baseline:
        return f"{baseline / ours:.1f}× {better}"
    return f"{ours / baseline:.1f}× {_OPPOSITE[better]}"


async def replag_case(
    config_path: Path, samples: int, *, keep: bool
) -> tuple[list[float], list[float], list[int], int]:
    config = load_config(config_path)
    targets, _ = replication_targets(config.topology)
    times, skews, moved = [], [], []
    commands = 0
    sampler = ReplicationSampler(timeout_s=2)
    try:
        await sampler.sample(targets)  # connect once (the kept case starts warm)
        for _ in range(samples):
            if not keep:
                await sampler.close()
            start = time.perf_counter()
            snapshot = await sampler.sample(targets)
            times.append((time.perf_counter() - start) * 1e3)
            primary = snapshot.primaries[0]
            skews.append(primary.read_skew_ns / 1e6)
            moved.append(primary.offset_moved)
            commands = snapshot.commands
    finally:
        await sampler.close()
    return times, skews, moved, commands


def baseline_case(config_path: Path, samples: int) -> tuple[list[float], list[int]]:
    """redis-py INFO replication per server in turn; window and bytes moved across it."""
    config = load_config(config_path)
    endpoints = [r.write for r in config.topology.regions if r.write] + [
        ep for r in config.topology.regions for ep in r.replicas
    ]
    clients = [redis.Redis(host=ep.host, port=ep.port) for ep in endpoints]
    windows, moved = [], []
    try:
        for _ in range(samples):
            start = time.perf_counter()
            first = clients[0].execute_command("INFO", "replication")
            for client in clients[1:]:
                client.execute_command("INFO", "replication")
            windows.append((time.perf_counter() - start) * 1e3)
            # What the primary wrote while the others were read: the figure's unknown error.
            last = clients[0].execute_command("INFO", "replication")
            moved.append(_offset(last) - _offset(first))
    finally:
        for client in clients:
            client.close()
    return windows, moved


def _offset(info: dict[str, object]) -> int:
    return int(str(info["master_repl_offset"]))


class Writer(threading.Thread):
    """Pipelined SETs of 512 B values into the primary until stopped."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port, self.stop = port, threading.Event()
        self.bytes = 0
        self.seconds = 0.0

    def run(self) -> None:
        value = b"v" * 512
        start = time.perf_counter()
        with redis.Redis(port=self.port) as client:
            i = 0
            while not self.stop.is_set():
                pipe = client.pipeline(transaction=False)
                for _ in range(50):
                    pipe.set(f"load:{i % 10000}", value)
                    i += 1
                pipe.execute()
        self.seconds = time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    args = parse_args(parser, samples=10)
    n = args.samples
    with tempfile.TemporaryDirectory() as tmp:
        lab_dir = Path(tmp) / "lab"
        state = lab_up(
            lab_dir,
            LabSpec(regions=("a", "b", "c"), delays_ms={"b": 10, "c": 40}, replicas=2),
        )
        try:
            path = lab_dir / "topology.toml"
            primary_port = next(p["port"] for p in state["processes"] if p["role"] == "primary")
            print(f"lab: 1 primary, 6 replicas (3 regions × 2); {n} samples per case")
            rows = {}
            for label, keep in (("kept connections", True), ("fresh connections", False)):
                times, skews, moved, commands = asyncio.run(replag_case(path, n, keep=keep))
                rows[label] = (times, skews)
                print(
                    f"replag sampler, {label:<18} {commands} commands in 3 round trips; "
                    f"time p50 {pct(times, 50):6.3f} ms p99 {pct(times, 99):6.3f} ms; "
                    f"read skew p50 {pct(skews, 50):6.3f} ms p99 {pct(skews, 99):6.3f} ms"
                )
            base, _ = baseline_case(path, n)
            print(
                f"baseline (redis-py INFO per server in turn)   7 commands in 7 round trips; "
                f"time p50 {pct(base, 50):6.3f} ms p99 {pct(base, 99):6.3f} ms = read window"
            )
            kept = rows["kept connections"]
            print(
                f"ratio: replag read skew p50 {pct(kept[1], 50):.3f} ms vs baseline window "
                f"{pct(base, 50):.3f} ms = {compared(pct(base, 50), pct(kept[1], 50), 'tighter')}; "
                f"sample time {compared(pct(base, 50), pct(kept[0], 50), 'faster')}"
            )

            writer = Writer(primary_port)
            writer.start()
            try:
                time.sleep(0.5)
                with redis.Redis(port=primary_port) as client:
                    start_offset = _offset(client.info("replication"))
                    t0 = time.perf_counter()
                    _, skews, moved, _ = asyncio.run(replag_case(path, n, keep=True))
                    base, base_moved = baseline_case(path, n)
                    end_offset = _offset(client.info("replication"))
                    rate = (end_offset - start_offset) / (time.perf_counter() - t0)
            finally:
                writer.stop.set()
                writer.join()
            print(f"under writes: primary stream {rate / 1e6:.2f} MB/s (512 B SETs, pipelined)")
            print(
                f"  replag: read skew p50 {pct(skews, 50):.3f} ms p99 {pct(skews, 99):.3f} ms; "
                f"bytes written inside it p50 {pct(moved, 50):,.0f} p99 {pct(moved, 99):,.0f} "
                f"(reported as ± {pct(moved, 50) / 2:,.0f} B at p50)"
            )
            print(
                f"  baseline: read window p50 {pct(base, 50):.3f} ms p99 {pct(base, 99):.3f} ms; "
                f"bytes written inside it p50 {pct(base_moved, 50):,.0f} "
                f"p99 {pct(base_moved, 99):,.0f} (not reported: an unknown error)"
            )
            error = compared(pct(base_moved, 50), max(pct(moved, 50), 1), "smaller")
            print(f"ratio: bytes-behind error p50 {error} than the baseline's")
        finally:
            lab_down(lab_dir)


if __name__ == "__main__":
    main()
