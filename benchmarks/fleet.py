"""What one `replag serve` carries, and how two share it: a fleet of small clusters.

For each case, a fleet lab (`replag lab up --fleet N`: N clusters of a primary and
two replicas, real redis-server processes) and K `replag serve` processes with the
default schedules (probe every 10 s, 200 probes per region, replication every
10 s), measured for `--seconds` after a warm-up:

- cpu: the serve processes' user+system CPU over the window (/proc), % of one core
  (summed over the K instances);
- peak memory: the largest VmHWM among the instances (their peak RSS), MB;
- store +S MB/h: the store's growth over the window (the SQLite file with its WAL,
  or `pg_database_size`), per hour;
- first request: each instance's first `GET /api/v1/lag/matrix?since=5m`, timed apart
  (no answer is built for the range yet: it waits for the first build; the slowest of
  the instances is printed);
- matrix p99: then, `GET /api/v1/lag/matrix?since=5m` open-loop at `--rate` req/s (100),
  spread over the instances, on a bounded pool of `--connections` (8) kept-open
  connections per instance (as a proxy or a dashboard fleet would hold; a client that
  opens a connection per request when the server is slow measures its own accept
  queue), timed from each request's scheduled send moment to its answer's last byte,
  so a request waiting for a free connection counts (no coordinated omission); a
  failed request counts as 30 s. The line also gives the p50 and the machine's load;
- one after 10 s without requests: after the open loop, 10 s idle, then one request
  per instance timed (a lone dashboard's refresh: the answer it finds is older than
  the 5 s a previous one may be served, so it waits for a build; the slowest printed);
- with K = 2: the probe units each instance owns at the end (the leases), as a share.

One instance uses the default SQLite store; two share a PostgreSQL the benchmark
starts (`replag.lab.postgres`).

The store-outage case (`--outage NxK`, default 10x3): K instances on PostgreSQL,
which is stopped for `--outage-seconds` (60) once the leases have settled, then
started again:

- probe gap: the longest gap between two probe runs of any source from the stop to
  the restart (runs stored afterwards: the gap is in the store, after recovery), and
  as a multiple of `probe_interval`;
- API p99 during the outage: health, alerts and the lag matrix in turn, round-robin
  over the instances, 20 requests/s, each timed (a failed or non-200 answer counts
  as 30 s); how many answered 200;
- rows recovered: the writes the instances held at the restart, the probe runs they
  counted during the outage (their /metrics) and how long after the restart every
  one of them was in `probe_runs`. There is no "without replag" baseline for a fleet
watcher; the figures are absolute, against the issue's goals (100 groups on one
instance under 1 core and 500 MB, matrix p99 <= 20 ms; 2 instances share 60/40
or better). Prints one line per case; asserts nothing.

    python benchmarks/fleet.py [--cases 10x1,50x1,100x1,100x2] [--seconds 60] [--rate 100]
                               [--outage 10x3] [--outage-seconds 60] [--smoke]

`--smoke`: one group on one instance for a few seconds, and a 6 s outage under three
instances with 1 s probes and 4 s leases (what the test suite runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import tomli_w
from _smoke import parse_args

from replag.lab.cluster import lab_down
from replag.lab.fleet import fleet_up
from replag.lab.postgres import LocalPostgres
from replag.lab.server import free_port

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def store_bytes(store: str) -> int:
    if store.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(store) as conn:
            row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
            return int(row[0]) if row else 0
    return sum(p.stat().st_size for p in Path(store).parent.glob(Path(store).name + "*"))


@contextlib.contextmanager
def serving(
    config: Path, k: int, workdir: Path
) -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    procs = []
    try:
        for i in range(k):
            port = free_port()
            log = (workdir / f"serve-{i}.log").open("wb")
            proc = subprocess.Popen(
                [sys.executable, "-m", "replag", "serve", "--config", str(config),
                 "--port", str(port), "--log-level", "warning"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            procs.append((proc, f"http://127.0.0.1:{port}"))
        deadline = time.monotonic() + 120
        for _, base in procs:
            while True:
                try:
                    if httpx.get(base + "/api/v1/health", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{base} never answered")
                time.sleep(0.5)
        yield procs
    finally:
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


REQUEST = b"GET /api/v1/lag/matrix?since=5m HTTP/1.1\r\nHost: replag\r\n\r\n"
FAILED_S = 30.0  # what a failed request counts as (never dropped)
LONE_AFTER_S = 10.0  # a lone dashboard's refresh interval


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """One GET of the matrix on a kept-open connection: whether the answer was fresh (not
    the previous one, served while the new one is computed); raise unless it is a 200."""
    writer.write(REQUEST)
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    body = await reader.readexactly(length)
    if status != b"200":
        raise OSError(f"HTTP {status.decode()}")
    return b'"fresh":false' not in body[:300]


async def matrix_latencies(
    bases: list[str], *, rate: float, seconds: float, connections: int
) -> tuple[list[float], int]:
    """Open loop: request i is due at start + i / rate (spread over the instances), whatever
    the answers before it did; `connections` kept-open connections per instance take the
    due requests in order. Latency is from the due moment to the last byte of the answer,
    so time a request waited for a free connection counts (no coordinated omission). A
    request that failed or took over FAILED_S counts as FAILED_S. Returns the latencies,
    sorted, and how many answers were the previous one (`"fresh": false`)."""
    latencies: list[float] = []
    stale = 0
    queues: list[asyncio.Queue[float | None]] = [asyncio.Queue() for _ in bases]

    async def worker(base: str, queue: asyncio.Queue[float | None]) -> None:
        nonlocal stale
        host, port = base.removeprefix("http://").rsplit(":", 1)
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while (due := await queue.get()) is not None:
            try:
                if conn is None:
                    conn = await asyncio.open_connection(host, int(port))
                fresh = await asyncio.wait_for(_get(*conn), FAILED_S)
                latencies.append(min(time.perf_counter() - due, FAILED_S))
                stale += not fresh
            except (OSError, asyncio.IncompleteReadError, TimeoutError, StopIteration, ValueError):
                latencies.append(FAILED_S)
                if conn is not None:
                    conn[1].close()
                conn = None
        if conn is not None:
            conn[1].close()

    workers = [
        asyncio.ensure_future(worker(base, queue))
        for base, queue in zip(bases, queues, strict=True)
        for _ in range(connections)
    ]
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        due = start + i / rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        queues[i % len(bases)].put_nowait(due)
    for queue in queues:
        for _ in range(connections):
            queue.put_nowait(None)
    await asyncio.gather(*workers)
    return sorted(latencies), stale


async def one_request_ms(bases: list[str]) -> float:
    """One matrix request per instance on a new connection, alone; the slowest, in ms
    (the first after start is cold: no answer is built for the range yet)."""
    slowest = 0.0
    for base in bases:
        host, port = base.removeprefix("http://").rsplit(":", 1)
        start = time.perf_counter()
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            await asyncio.wait_for(_get(reader, writer), FAILED_S)
            writer.close()
            took = time.perf_counter() - start
        except (OSError, asyncio.IncompleteReadError, TimeoutError, StopIteration, ValueError):
            took = FAILED_S
        slowest = max(slowest, took)
    return slowest * 1000


def percentile_ms(latencies: list[float], q: float) -> float:
    return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000


def probe_share(base: str) -> str:
    health = httpx.get(base + "/api/v1/health", timeout=10).json()
    counts = [sum(u.startswith("probe:") for u in entry["owns"]) for entry in health["instances"]]
    total = sum(counts) or 1
    return "/".join(f"{round(100 * c / total)}" for c in sorted(counts, reverse=True))


def run_case(n: int, k: int, args: argparse.Namespace, pg: LocalPostgres | None) -> str:
    with tempfile.TemporaryDirectory(prefix="replag-fleet-") as tmp:
        workdir = Path(tmp)
        fleet_up(workdir / "lab", n)
        try:
            if k > 1:
                assert pg is not None
                store = pg.create_database(f"fleet_{n}_{k}_{int(time.time())}")
            else:
                store = str(workdir / "replag.sqlite")
            data = tomllib.loads((workdir / "lab" / "topology.toml").read_text())
            data["settings"] = {"store": store, "check_interval": "24h"}
            config = workdir / "replag.toml"
            config.write_text(tomli_w.dumps(data))
            with serving(config, k, workdir) as procs:
                time.sleep(args.warmup)
                pids = [p.pid for p, _ in procs]
                size0, cpu0, t0 = store_bytes(store), sum(map(cpu_s, pids)), time.monotonic()
                load0 = os.getloadavg()[0]
                first = asyncio.run(one_request_ms([b for _, b in procs]))
                latencies, stale = asyncio.run(
                    matrix_latencies(
                        [b for _, b in procs],
                        rate=args.rate,
                        seconds=args.api_seconds,
                        connections=args.connections,
                    )
                )
                p99, p50 = percentile_ms(latencies, 0.99), percentile_ms(latencies, 0.5)
                # A dashboard alone polls every 10 s: its answer is then older than
                # RECENT_S, so it waits for a build (of the pairs with new windows only).
                time.sleep(args.lone_after)
                lone = asyncio.run(one_request_ms([b for _, b in procs]))
                time.sleep(max(0.0, args.seconds - (time.monotonic() - t0)))
                elapsed = time.monotonic() - t0
                cpu = (sum(map(cpu_s, pids)) - cpu0) / elapsed * 100
                growth = (store_bytes(store) - size0) / 1e6 / elapsed * 3600
                peak = max(map(peak_mb, pids))
                share = f", probe share {probe_share(procs[0][1])}" if k > 1 else ""
                load = (load0 + os.getloadavg()[0]) / 2
        finally:
            lab_down(workdir / "lab")
    return (
        f"fleet: {n} groups, {k} instances: cpu {cpu:.0f} % of a core, peak memory "
        f"{peak:.0f} MB, store +{growth:.1f} MB/h, matrix p99 {p99:.1f} ms{share} "
        f"(p50 {p50:.1f} ms, {100 * stale / len(latencies):.0f} % of answers the previous "
        f"one; the first request, timed apart: {first:.0f} ms; one after {args.lone_after:g} s "
        f"without requests: {lone:.0f} ms; load average {load:.1f} on {os.cpu_count()} cores)"
    )


OUTAGE_RATE = 20.0  # API requests per second during the outage
OUTAGE_PATHS = ("/api/v1/health", "/api/v1/alerts", "/api/v1/lag/matrix")


def runs_counted(bases: list[str]) -> float:
    """Probe runs the instances made (each counts its own), from their /metrics."""
    total = 0.0
    for base in bases:
        for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
            if line.startswith("replag_probe_runs_total{") and 'outcome="ok"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def probe_rows(store: str) -> list[tuple[str, int]]:
    import psycopg

    with psycopg.connect(store) as conn:
        return [(str(r[0]), int(r[1])) for r in conn.execute(
            "SELECT source, started_ns FROM probe_runs ORDER BY source, started_ns"
        )]  # fmt: skip


def longest_gap_s(rows: list[tuple[str, int]], since_ns: int, until_ns: int) -> float:
    """The longest gap between two stored probe runs of one source within the window
    (counting from its edges: no run at all is a gap as long as the window)."""
    longest = 0
    for source in {s for s, _ in rows}:
        starts = [since_ns, *(t for s, t in rows if s == source and since_ns < t < until_ns)]
        starts.append(until_ns)
        longest = max(longest, *(b - a for a, b in itertools.pairwise(starts)))
    return longest / 1e9


def api_during(bases: list[str], seconds: float) -> tuple[list[float], int]:
    """Health, alerts and matrix in turn over the instances at OUTAGE_RATE for `seconds`:
    each request's time (FAILED_S when it failed or was not a 200), and the 200s."""
    latencies: list[float] = []
    ok = 0
    start = time.perf_counter()
    with httpx.Client(timeout=FAILED_S) as client:
        for i in range(int(OUTAGE_RATE * seconds)):
            due = start + i / OUTAGE_RATE
            time.sleep(max(0.0, due - time.perf_counter()))
            base, path = bases[i % len(bases)], OUTAGE_PATHS[i % len(OUTAGE_PATHS)]
            sent = time.perf_counter()
            try:
                answered = client.get(base + path).status_code == 200
            except httpx.HTTPError:
                answered = False
            ok += answered
            latencies.append(time.perf_counter() - sent if answered else FAILED_S)
    return sorted(latencies), ok


def held_writes(base: str) -> int:
    """The writes an instance holds now (its health's store section); 0 if it cannot say."""
    answer = httpx.get(base + "/api/v1/health", timeout=FAILED_S)
    if answer.status_code != 200:
        print(f"{base}/api/v1/health: HTTP {answer.status_code}: {answer.text}", flush=True)
        return 0
    return int(answer.json()["store"]["deferred"])


def run_outage(n: int, k: int, args: argparse.Namespace, pg: LocalPostgres) -> str:
    with tempfile.TemporaryDirectory(prefix="replag-outage-") as tmp:
        workdir = Path(args.keep or tmp)  # --keep DIR: the serve logs stay there
        fleet_up(workdir / "lab", n)
        try:
            store = pg.create_database(f"outage_{n}_{k}_{int(time.time())}")
            data = tomllib.loads((workdir / "lab" / "topology.toml").read_text())
            data["settings"] = {
                "store": store,
                "check_interval": "24h",
                "probe_interval": f"{args.probe_interval}s",
                "lease_time": f"{args.lease_time}s",
                "store_spill_dir": str(workdir / "held"),
            }
            config = workdir / "replag.toml"
            config.write_text(tomli_w.dumps(data))
            with serving(config, k, workdir) as procs:
                bases = [b for _, b in procs]
                time.sleep(args.outage_warmup)  # the leases settle, probing is under way
                counted0 = runs_counted(bases)
                rows0 = len(probe_rows(store))
                load0 = os.getloadavg()[0]
                pg.stop()
                stopped_ns = time.time_ns()
                latencies, ok = api_during(bases, args.outage_seconds)
                held = sum(held_writes(b) for b in bases)
                counted = runs_counted(bases) - counted0
                pg.start()
                back_ns, back = time.time_ns(), time.monotonic()
                recovered_s = None
                while time.monotonic() - back < 120:
                    if len(probe_rows(store)) - rows0 >= counted:
                        recovered_s = time.monotonic() - back
                        break
                    time.sleep(0.2)
                gap = longest_gap_s(probe_rows(store), stopped_ns, back_ns)
                load = (load0 + os.getloadavg()[0]) / 2
        finally:
            lab_down(workdir / "lab")
    stored = (
        f"all stored {recovered_s:.1f} s after the restart"
        if recovered_s is not None
        else "NOT all stored within 120 s"
    )
    return (
        f"store outage: PostgreSQL stopped {args.outage_seconds:g} s under {k} instances, "
        f"{n} groups: longest probe gap {gap:.1f} s ({gap / args.probe_interval:.2f} x "
        f"probe_interval {args.probe_interval:g} s), API p99 during the outage "
        f"{percentile_ms(latencies, 0.99):.1f} ms (p50 {percentile_ms(latencies, 0.5):.1f} ms; "
        f"health, alerts, matrix: {ok} of {len(latencies)} answered 200), rows recovered: "
        f"{held} writes held at the restart, {counted:.0f} probe runs made during the "
        f"outage, {stored} (lease_time {args.lease_time:g} s; load average {load:.1f} on "
        f"{os.cpu_count()} cores)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="10x1,50x1,100x1,100x2")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--api-seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument(
        "--connections", type=int, default=8, help="kept-open connections per instance"
    )
    parser.add_argument("--outage", default="10x3", help="NxK, or none")
    parser.add_argument("--outage-seconds", type=float, default=60.0)
    parser.add_argument("--outage-warmup", type=float, default=45.0)
    parser.add_argument("--probe-interval", type=float, default=10.0)
    parser.add_argument("--lease-time", type=float, default=20.0)
    parser.add_argument("--keep", default=None, help="the outage case's directory (kept)")
    parser.set_defaults(lone_after=LONE_AFTER_S)
    args = parse_args(
        parser,
        cases="1x1",
        seconds=2.0,
        warmup=2.0,
        api_seconds=1.0,
        rate=20.0,
        outage="1x3",
        outage_seconds=4.0,
        outage_warmup=6.0,
        probe_interval=1.0,
        lease_time=4.0,
        lone_after=1.0,
    )
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",") if c]
    outage = None if args.outage == "none" else tuple(int(x) for x in args.outage.split("x"))
    needs_pg = any(k > 1 for _, k in cases) or outage is not None
    pg = LocalPostgres().start() if needs_pg else None
    try:
        for n, k in cases:
            print(run_case(n, k, args, pg), flush=True)
        if outage is not None:
            assert pg is not None
            print(run_outage(outage[0], outage[1], args, pg), flush=True)
    finally:
        if pg is not None:
            pg.destroy()


if __name__ == "__main__":
    main()
