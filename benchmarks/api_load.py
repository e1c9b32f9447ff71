"""Load on the lag API: a day of one-minute windows for 6 region pairs, served by `replag serve`.

Fills a store with 24 h × 60 windows × 6 pairs (each window 200 samples of a
lognormal lag with a daily wave), starts `replag serve` in a subprocess, then
drives `/api/v1/lag/matrix` and `/api/v1/lag/series` from aiohttp clients:
open-loop at a fixed rate (the 500 req/s target) and closed-loop (as fast as
N clients go). Prints req/s and p50/p99 latency; asserts nothing.

    python benchmarks/api_load.py [--rate 500] [--seconds 10] [--clients 32]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

from replag.store import LagWindow, Store
from replag.store import summarize as merge_windows

REGIONS = ("us-east", "us-west", "eu-west")
BASE_MS = {"us-west": 35.0, "eu-west": 80.0, "us-east": 12.0}
MINUTE_NS = 60 * 10**9


def fill_store(store: Store, *, hours: int = 24, samples: int = 200, seed: int = 1) -> int:
    """Append one window per minute per (source, target) pair; return how many."""
    rng = np.random.default_rng(seed)
    end = time.time_ns() // MINUTE_NS * MINUTE_NS
    windows = []
    for source in REGIONS:
        for target in REGIONS:
            if source == target:
                continue
            for minute in range(hours * 60):
                start_ns = end - (hours * 60 - minute) * MINUTE_NS
                wave = 1 + 0.35 * math.sin(2 * math.pi * minute / 1440)
                lag_us = rng.lognormal(math.log(BASE_MS[target] * 1000 * wave), 0.35, samples)
                lost = int(rng.random() < 0.02)
                window = LagWindow(
                    run_id=f"bench{minute}",
                    source=source,
                    target=target,
                    replica=f"{target}-1",
                    start_ns=start_ns,
                    end_ns=start_ns + MINUTE_NS,
                    sent=samples,
                    seen=samples - lost,
                    lost=lost,
                )
                for value, count in zip(
                    *np.unique(np.rint(lag_us[lost:]), return_counts=True), strict=True
                ):
                    window.lag.hdr.record_value(int(value), int(count))
                    window.uncertainty.hdr.record_value(int(value) // 20 + 1, int(count))
                window.write.hdr.record_value(400, samples)
                windows.append(window)
    for start in range(0, len(windows), 500):
        store.append_windows(windows[start : start + 500])
    return len(windows)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(directory: Path) -> Path:
    # Regions without write endpoints: the service probes nothing and only serves the store.
    lines = ["[settings]", f'store = "{directory / "bench.sqlite"}"', 'window = "60s"', ""]
    for i, region in enumerate(REGIONS):
        lines += [
            "[[regions]]",
            f'name = "{region}"',
            f'replicas = ["redis://127.0.0.1:{7001 + i}"]',
            "",
        ]
    path = directory / "bench.toml"
    path.write_text("\n".join(lines))
    return path


async def wait_ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            if proc.poll() is not None:
                raise SystemExit(f"replag serve exited with {proc.returncode}")
            try:
                async with session.get(f"{base}/api/v1/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit("replag serve did not answer within 20 s")


async def timed_get(session: aiohttp.ClientSession, url: str, out: list[float]) -> bool:
    started = time.perf_counter()
    async with session.get(url) as response:
        await response.read()
        ok = response.status == 200
    out.append((time.perf_counter() - started) * 1000)
    return ok


async def open_loop(base: str, paths: list[str], rate: float, seconds: float) -> dict[str, float]:
    """Send at a fixed rate regardless of answers (no coordinated omission)."""
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = []
        started = time.perf_counter()
        total = int(rate * seconds)
        for i in range(total):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(
                asyncio.create_task(timed_get(session, base + paths[i % len(paths)], latencies))
            )
        results = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.perf_counter() - started
    errors = sum(r is not True for r in results)
    return summarize(latencies, elapsed, errors)


async def closed_loop(
    base: str, paths: list[str], clients: int, seconds: float
) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def client(n: int, session: aiohttp.ClientSession) -> None:
        nonlocal errors
        i = n
        while time.perf_counter() < deadline:
            if not await timed_get(session, base + paths[i % len(paths)], latencies):
                errors += 1
            i += 1

    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        await asyncio.gather(*(client(n, session) for n in range(clients)))
    return summarize(latencies, time.perf_counter() - started, errors)


def summarize(latencies: list[float], elapsed: float, errors: int) -> dict[str, float]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else math.nan
    return {
        "rps": len(latencies) / elapsed,
        "p50": statistics.median(ordered) if ordered else math.nan,
        "p99": p99,
        "n": len(latencies),
        "errors": errors,
    }


def line(name: str, mode: str, result: dict[str, float]) -> str:
    return (
        f"{name:<34} {mode:<24} {result['rps']:7.0f} req/s  p50 {result['p50']:6.2f} ms  "
        f"p99 {result['p99']:6.2f} ms  ({int(result['n'])} requests, "
        f"{int(result['errors'])} errors)"
    )


def naive_matrix_ms(store: Store, *, since_ns: int, rounds: int = 3) -> float:
    """Baseline: what one matrix request costs without the lag index (decode and merge all)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for source, target in store.pairs(since_ns=since_ns):
            windows = store.windows(source=source, target=target, since_ns=since_ns)
            merge_windows(windows, source=source, target=target, replica=None)
        best = min(best, (time.perf_counter() - t0) * 1000)
    return best


async def drive(
    base: str, proc: subprocess.Popen[bytes], args: argparse.Namespace
) -> dict[str, float]:
    await wait_ready(base, proc)
    matrix = [
        "/api/v1/lag/matrix?since=24h",
        "/api/v1/lag/matrix?since=1h",
        "/api/v1/lag/matrix?since=15m",
    ]
    series = [
        f"/api/v1/lag/series?source={s}&target={t}&since=24h&step=5m"
        for s in REGIONS
        for t in REGIONS
        if s != t
    ]
    async with aiohttp.ClientSession() as session:
        for path in matrix + series:  # the first of each may decode windows: report it apart
            first: list[float] = []
            await timed_get(session, base + path, first)
            if path in (matrix[0], series[0]):
                print(f"first request {path}: {first[0]:.0f} ms")
    # Unmeasured: the service decodes the last day of windows in a background thread at
    # start; what follows is steady state.
    await open_loop(base, matrix + series, args.rate, 5.0)
    matrix_open = await open_loop(base, matrix, args.rate, args.seconds)
    print(line("GET /api/v1/lag/matrix (3 ranges)", f"open loop {args.rate:g}/s", matrix_open))
    print(
        line(
            "GET /api/v1/lag/series (6 pairs)",
            f"open loop {args.rate:g}/s",
            await open_loop(base, series, args.rate, args.seconds),
        )
    )
    print(
        line(
            "GET /api/v1/lag/matrix (3 ranges)",
            f"closed {args.clients} clients",
            await closed_loop(base, matrix, args.clients, args.seconds),
        )
    )
    print(
        line(
            "GET /api/v1/lag/series (6 pairs)",
            f"closed {args.clients} clients",
            await closed_loop(base, series, args.clients, args.seconds),
        )
    )
    return matrix_open


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--hours", type=int, default=24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="replag-bench-") as tmp:
        directory = Path(tmp)
        config = write_config(directory)
        store = Store(directory / "bench.sqlite")
        t0 = time.perf_counter()
        count = fill_store(store, hours=args.hours)
        print(
            f"store: {count} windows ({args.hours} h × 60 × 6 pairs) written in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        day_ago = time.time_ns() - 86_400 * 10**9
        baseline = naive_matrix_ms(store, since_ns=day_ago)
        store.close()
        print(
            f"baseline: 24 h matrix straight from the store (decode + merge every window): "
            f"{baseline:.0f} ms per request"
        )
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "replag",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            matrix_open = asyncio.run(drive(f"http://127.0.0.1:{port}", proc, args))
            print(
                f"ratio: served matrix p50 {matrix_open['p50']:.2f} ms vs baseline "
                f"{baseline:.0f} ms = {baseline / matrix_open['p50']:.0f}× faster; "
                f"target p99 ≤ 20 ms at {args.rate:g} req/s: "
                + ("met" if matrix_open["p99"] <= 20 else "MISSED")
            )
        finally:
            proc.terminate()
            proc.wait(timeout=15)


if __name__ == "__main__":
    main()
