"""Load on the lag API: a day of one-minute windows for 6 region pairs, served by `replag serve`.

Fills a store with 24 h × 60 windows × 6 pairs (each window 200 samples of a
lognormal lag with a daily wave), then serves it twice with `replag serve` in a
subprocess and drives `/api/v1/lag/matrix` and `/api/v1/lag/series` from
aiohttp clients, open-loop at a fixed rate (the 500 req/s target) and
closed-loop (as fast as N clients go):

1. idle: the topology has no write endpoint, so the service only serves;
2. with its schedules: the same store, and a live three-region lab (real
   redis-server processes, 40 and 80 ms links) that the service probes every
   `--probe-interval` (200 probes each) and repair-checks every
   `--check-interval` (`--keys` keys per replica), in the same process.

Open-loop latency runs from each request's scheduled send moment (a request
sent late because the loop was behind is timed from when it was due: no
coordinated omission). Answers the API marks `"fresh": false` (an older cached
body while a newer one is built) are counted apart: req/s and latencies are
given for fresh answers, with the stale count beside them.

Prints req/s and p50/p99 latency of both, the probe rounds and checks the
service ran meanwhile (from its own metrics), and the ratios like for like
against a baseline without replag's index: cold (the first 24 h matrix a newly
started service answers, against decoding and merging every window from the
store) and warm (the service's 24 h matrix in steady state, against merging the
same windows already decoded in memory); asserts nothing.

    python benchmarks/api_load.py [--rate 500] [--seconds 10] [--clients 32] [--keys 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import tomli_w
from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.lab.load import LoadSpec, lab_load
from replag.lab.server import free_port
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


def write_config(directory: Path) -> Path:
    # Regions without write endpoints: the service probes nothing and only serves the store.
    lines = [
        "[settings]",
        f'store = "{directory / "bench.sqlite"}"',
        "store_shared = true",
        'window = "60s"',
        "",
    ]
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


def write_lab_config(directory: Path, lab_dir: Path, args: argparse.Namespace) -> Path:
    """The lab's topology (a write endpoint in us-east, one replica group) on the same store,
    with the service probing and checking on the given schedules."""
    data = tomllib.loads((lab_dir / "topology.toml").read_text())
    data["settings"].update(
        store=str(directory / "bench.sqlite"),
        store_shared=True,  # the load phases' two configs read one store on purpose
        window="60s",
        probe_interval=f"{args.probe_interval}s",
        check_interval=f"{args.check_interval}s",
        count=200,
        rate=200,
    )
    path = directory / "bench-lab.toml"
    path.write_text(tomli_w.dumps(data))
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


class Timings:
    """Latencies (ms) of the answers, fresh and stale apart, and of the 24 h matrix."""

    def __init__(self) -> None:
        self.fresh: list[float] = []
        self.stale: list[float] = []
        self.day_matrix: list[float] = []  # fresh answers to MATRIX[0] only


async def timed_get(
    session: aiohttp.ClientSession,
    base: str,
    path: str,
    out: Timings,
    *,
    due: float | None = None,
) -> bool:
    """GET `base + path`, timed from `due` (its scheduled send moment) if given, else from
    now; True if answered 200. An answer that says `"fresh":false` is timed as stale."""
    started = time.perf_counter() if due is None else due
    async with session.get(base + path) as response:
        body = await response.read()
        ok = response.status == 200
    latency = (time.perf_counter() - started) * 1000
    if ok and b'"fresh":false' in body[:300]:
        out.stale.append(latency)
    elif ok:
        out.fresh.append(latency)
        if path == MATRIX[0]:
            out.day_matrix.append(latency)
    return ok


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No garbage collection in this (the load generator's) process while it times requests.

    A full pass here took 40–120 ms with the schedules running (135,000 objects: aiohttp,
    numpy, the latencies so far), and every request in flight meanwhile was timed that
    much slower than the server answered it. A phase allocates a few MB; freed after it.
    """
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


async def open_loop(base: str, paths: list[str], rate: float, seconds: float) -> dict[str, float]:
    """Send at a fixed rate regardless of answers (no coordinated omission)."""
    with collector_paused():
        return await _open_loop(base, paths, rate, seconds)


async def _open_loop(base: str, paths: list[str], rate: float, seconds: float) -> dict[str, float]:
    timings = Timings()
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = []
        started = time.perf_counter()
        total = int(rate * seconds)
        for i in range(total):
            due = started + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            path = paths[i % len(paths)]
            tasks.append(asyncio.create_task(timed_get(session, base, path, timings, due=due)))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.perf_counter() - started
    errors = sum(r is not True for r in results)
    return summarize(timings, elapsed, errors)


async def closed_loop(
    base: str, paths: list[str], clients: int, seconds: float
) -> dict[str, float]:
    timings = Timings()
    errors = 0
    deadline = time.perf_counter() + seconds

    async def client(n: int, session: aiohttp.ClientSession) -> None:
        nonlocal errors
        i = n
        while time.perf_counter() < deadline:
            if not await timed_get(session, base, paths[i % len(paths)], timings):
                errors += 1
            i += 1

    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=clients)
    with collector_paused():
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(*(client(n, session) for n in range(clients)))
    return summarize(timings, time.perf_counter() - started, errors)


def _p(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def summarize(timings: Timings, elapsed: float, errors: int) -> dict[str, float]:
    fresh, stale = sorted(timings.fresh), sorted(timings.stale)
    return {
        "rps": len(fresh) / elapsed,
        "p50": statistics.median(fresh) if fresh else math.nan,
        "p99": _p(fresh, 0.99),
        "n": len(fresh),
        "stale": len(stale),
        "stale_p50": statistics.median(stale) if stale else math.nan,
        "day_p50": statistics.median(timings.day_matrix) if timings.day_matrix else math.nan,
        "errors": errors,
    }


def line(name: str, mode: str, result: dict[str, float]) -> str:
    return (
        f"{name:<34} {mode:<24} {result['rps']:7.0f} fresh req/s  p50 {result['p50']:6.2f} ms  "
        f"p99 {result['p99']:6.2f} ms  ({int(result['n'])} fresh answers; "
        f"{int(result['stale'])} stale, p50 {result['stale_p50']:.2f} ms; "
        f"{int(result['errors'])} errors)"
    )


def naive_matrix_ms(store: Store, *, since_ns: int, rounds: int = 3) -> tuple[float, float]:
    """Baselines without the lag index, best of `rounds`: one 24 h matrix cold (read,
    decode and merge every window from the store) and warm (every window already decoded
    in memory, merged per request)."""
    cold = warm = float("inf")
    decoded: dict[tuple[str, str], list[LagWindow]] = {}
    for _ in range(rounds):
        t0 = time.perf_counter()
        for source, target in store.pairs(since_ns=since_ns):
            windows = store.windows(source=source, target=target, since_ns=since_ns)
            merge_windows(windows, source=source, target=target, replica=None)
            decoded[source, target] = windows
        cold = min(cold, (time.perf_counter() - t0) * 1000)
    for _ in range(rounds):
        t0 = time.perf_counter()
        for (source, target), windows in decoded.items():
            merge_windows(windows, source=source, target=target, replica=None)
        warm = min(warm, (time.perf_counter() - t0) * 1000)
    return cold, warm


MATRIX = [
    "/api/v1/lag/matrix?since=24h",
    "/api/v1/lag/matrix?since=1h",
    "/api/v1/lag/matrix?since=15m",
]
SERIES = [
    f"/api/v1/lag/series?source={s}&target={t}&since=24h&step=5m"
    for s in REGIONS
    for t in REGIONS
    if s != t
]


async def drive(base: str, args: argparse.Namespace, label: str) -> dict[str, dict[str, float]]:
    """The four measured loads; each line printed with `label` (idle / schedules)."""
    first: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:
        for path in MATRIX + SERIES:  # the first of each may decode windows: report it apart
            timings = Timings()
            await timed_get(session, base, path, timings)
            (first[path],) = timings.fresh + timings.stale
            if path in (MATRIX[0], SERIES[0]):
                fresh = "fresh" if timings.fresh else "stale"
                print(f"{label}: first request {path}: {first[path]:.0f} ms ({fresh})")
    # Unmeasured: the service decodes the last day of windows in a background thread at
    # start; what follows is steady state.
    await open_loop(base, MATRIX + SERIES, args.rate, 5.0)
    out = {
        "matrix open": await open_loop(base, MATRIX, args.rate, args.seconds),
        "series open": await open_loop(base, SERIES, args.rate, args.seconds),
        "matrix closed": await closed_loop(base, MATRIX, args.clients, args.seconds),
        "series closed": await closed_loop(base, SERIES, args.clients, args.seconds),
        "first": {"day_matrix": first[MATRIX[0]]},
    }
    for key, result in out.items():
        if key == "first":
            continue
        what = "matrix (3 ranges)" if key.startswith("matrix") else "series (6 pairs)"
        mode = f"open loop {args.rate:g}/s" if key.endswith("open") else f"closed {args.clients}"
        print(line(f"{label:<9} GET /api/v1/lag/{what}", mode, result))
    return out


async def counters(base: str) -> dict[str, float]:
    """Probe runs and repair checks so far, from the service's own /metrics."""
    async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as response:
        text = await response.text()
    out = {"probe runs": 0.0, "checks": 0.0}
    for row in text.splitlines():
        if row.startswith("replag_probe_runs_total{"):
            out["probe runs"] += float(row.rsplit(" ", 1)[1])
        elif row.startswith("replag_repair_runs_total{") and 'action="check"' in row:
            out["checks"] += float(row.rsplit(" ", 1)[1])
    return out


async def probe_lag(base: str, since_ns: int, until_ns: int) -> dict[str, float | None]:
    """p99 lag per target of the probe windows that ended between the two times."""
    async with aiohttp.ClientSession() as session:
        span = {
            "source": "us-east",
            "since": f"{since_ns / 1e9:.3f}",
            "until": f"{until_ns / 1e9:.3f}",
        }
        async with session.get(f"{base}/api/v1/lag", params=span) as response:
            body = await response.json()
    return {p["target"]: p["lag_ms"]["p99"] for p in body["pairs"]}


async def scheduled(base: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The loads with the schedules running; and the probes' own figures, quiet vs loaded."""
    quiet_from = time.time_ns()
    await asyncio.sleep(args.seconds * 2)  # probes and a check with no API load
    quiet = await probe_lag(base, quiet_from, time.time_ns())
    before, loaded_from = await counters(base), time.time_ns()
    out = await drive(base, args, "schedules")
    after, loaded = await counters(base), await probe_lag(base, loaded_from, time.time_ns())
    print(
        f"schedules meanwhile: {after['probe runs'] - before['probe runs']:.0f} probe rounds "
        f"(200 probes each), {after['checks'] - before['checks']:.0f} repair checks "
        f"({args.keys} keys per replica)"
    )
    for target in sorted(quiet):
        print(
            f"probe p99 us-east→{target}: {quiet[target]:.2f} ms without API load, "
            f"{loaded.get(target) or float('nan'):.2f} ms under it"
        )
    return out


def serve(config: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "replag", "serve", "--config", str(config), "--port", str(port),
         "--log-level", "warning"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def run_served(config: Path, args: argparse.Namespace, phase: Any) -> dict[str, dict[str, float]]:
    port = free_port()
    proc = serve(config, port)
    base = f"http://127.0.0.1:{port}"
    try:

        async def go() -> dict[str, dict[str, float]]:
            await wait_ready(base, proc)
            result: dict[str, dict[str, float]] = await phase(base, args)
            return result

        return asyncio.run(go())
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--keys", type=int, default=50_000, help="keys per replica checked")
    parser.add_argument("--probe-interval", type=float, default=1.0)
    parser.add_argument("--check-interval", type=float, default=15.0)
    parser.add_argument(
        "--only-schedules", action="store_true", help="skip the idle phase and the baseline"
    )
    args = parse_args(
        parser, seconds=1.0, rate=50.0, clients=4, hours=1, keys=2000, check_interval=1.0
    )
    with tempfile.TemporaryDirectory(prefix="replag-bench-") as tmp:
        directory = Path(tmp)
        store = Store(directory / "bench.sqlite")
        t0 = time.perf_counter()
        count = fill_store(store, hours=args.hours)
        print(
            f"store: {count} windows ({args.hours} h × 60 × 6 pairs) written in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        day_ago = time.time_ns() - 86_400 * 10**9
        cold, warm = (0.0, 0.0) if args.only_schedules else naive_matrix_ms(store, since_ns=day_ago)
        store.close()
        if not args.only_schedules:
            print(
                f"baseline, one 24 h matrix without the index: cold (read, decode and merge "
                f"every window from the store) {cold:.0f} ms; warm (windows already decoded in "
                f"memory, merged per request) {warm:.1f} ms"
            )
            idle = run_served(write_config(directory), args, lambda b, a: drive(b, a, "idle"))
        lab_dir = directory / "lab"
        lab_up(lab_dir, LabSpec(regions=REGIONS, delays_ms={"us-west": 40, "eu-west": 80}))
        try:
            lab_load(lab_dir, LoadSpec(keys=args.keys, value_size=100))
            busy = run_served(write_lab_config(directory, lab_dir, args), args, scheduled)
        finally:
            lab_down(lab_dir)
    if not args.only_schedules:
        compare(idle, busy, cold, warm)
    print(
        f"target p99 ≤ 20 ms at {args.rate:g} req/s (matrix, schedules running): "
        + ("met" if busy["matrix open"]["p99"] <= 20 else "MISSED")
    )


def speed(base_ms: float, ours_ms: float) -> str:
    """`ours_ms` against `base_ms` as "N× faster" or "N× slower"."""
    if ours_ms <= base_ms:
        return f"{base_ms / ours_ms:.1f}× faster"
    return f"{ours_ms / base_ms:.1f}× slower"


def compare(
    idle: dict[str, dict[str, float]],
    busy: dict[str, dict[str, float]],
    cold: float,
    warm: float,
) -> None:
    first = idle["first"]["day_matrix"]
    print(
        f"ratio, cold vs cold (idle): a new service's first 24 h matrix {first:.0f} ms (over "
        f"HTTP) vs the cold baseline {cold:.0f} ms: {speed(cold, first)}"
    )
    day = idle["matrix open"]["day_p50"]
    print(
        f"ratio, warm vs warm (idle, open loop): the 24 h matrix's fresh answers p50 "
        f"{day:.2f} ms (over HTTP) vs the warm baseline {warm:.1f} ms (in process): "
        f"{speed(warm, day)}"
    )
    for key in ("matrix open", "series open"):
        print(
            f"schedules vs idle, {key} loop p99: {busy[key]['p99']:.2f} ms vs "
            f"{idle[key]['p99']:.2f} ms = {busy[key]['p99'] / idle[key]['p99']:.1f}×"
        )


if __name__ == "__main__":
    main()
