"""Poll-mode lag on a real Dynomite against a reference poller, and what the poll costs.

Two racks (dc1-rack1, dc1-rack2), one node each over a redis-server backend. Probe
keys are written through rack1's client port and read on each rack's backend, as
`replag probe` does. Per round, interleaved, for each rack's backend:

- the reference: one key at a time, written through the client port, then `GET` back
  to back on the backend until it is there, in a loop of its own (no event loop, no
  other work); a key's lag is the midpoint of the last miss's send and the hit's
  answer, minus the midpoint of the write's send and acknowledgement;
- `replag probe --mode poll` as shipped: the interval (settings.poll_interval, 1 ms)
  with back-to-back rounds for POLL_BURST_S after each write (`probes.observers`);
- the same with the burst off (POLL_BURST_S = 0: a round every interval only, the
  poll before this change).

Printed per rack: each p50 (the median over rounds of each round's p50) and its ratio
to the reference's, and the cost on the backend over the probe runs: MGET calls per
probe key and per second of run, and the backend's CPU (used_cpu_sys+user) per key.

    python benchmarks/dynomite_poll.py [--rounds 5] [--keys 200] [--rate 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import hiredis
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)

from replag.config import Config
from replag.probes import observers, run_probe
from replag.wire.resp import pack
from tests.helpers.dynomite_cluster import DYNOMITE_ENV, DynomiteCluster, dynomite_cluster

LAYOUT = (("dc1", "rack1"), ("dc1", "rack2"))


class Wire:
    """A blocking RESP2 connection: one command, one reply."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def call(self, *args: bytes | str) -> Any:
        self.sock.sendall(pack(*args))
        while True:
            reply = self.reader.gets()
            if reply is not False:
                return reply
            self.reader.feed(self.sock.recv(65536))

    def close(self) -> None:
        self.sock.close()


def reference(write_port: int, read_port: int, keys: int) -> list[float]:
    """Lags (ms) of `keys` keys, each polled back to back until present (see above)."""
    writer, reader = Wire(write_port), Wire(read_port)
    lags: list[float] = []
    try:
        for i in range(keys):
            key = f"replag:probe:ref:{uuid.uuid4().hex[:8]}:{i}"
            sent = time.perf_counter_ns()
            writer.call("SET", key, "1", "PX", "10000")
            acked = time.perf_counter_ns()
            last_miss = acked
            while True:
                asked = time.perf_counter_ns()
                if reader.call("GET", key) is not None:
                    answered = time.perf_counter_ns()
                    break
                last_miss = asked
                if asked - sent > 5e9:
                    raise SystemExit(f"reference: {key} never arrived on port {read_port}")
            lags.append(((last_miss + answered) / 2 - (sent + acked) / 2) / 1e6)
            time.sleep(0.002)
    finally:
        writer.close()
        reader.close()
    return lags


def backend_figures(cluster: DynomiteCluster) -> dict[int, tuple[int, float]]:
    """Per backend port: (MGET calls so far, CPU seconds so far)."""
    out = {}
    for node in cluster.nodes:
        with redis.Redis(port=node.backend.port) as c:
            stats = c.info("commandstats").get("cmdstat_mget", {})
            cpu = c.info("cpu")
        out[node.backend.port] = (
            int(stats.get("calls", 0)),
            float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        )
    return out


async def probe(config: Config, keys: int, rate: float, burst_s: float) -> tuple[Any, float]:
    observers.POLL_BURST_S = burst_s
    started = time.perf_counter()
    report = await run_probe(config, count=keys, rate=rate, mode="poll")
    return report, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--rate", type=float, default=200.0)
    args = parse_args(parser, rounds=1, keys=20)
    binary = os.environ.get(DYNOMITE_ENV, "")
    if not os.access(binary, os.X_OK):
        print(f"{DYNOMITE_ENV} names no Dynomite binary ({binary!r}): nothing measured")
        return
    burst = observers.POLL_BURST_S
    cases = {"reference": 0.0, f"replag poll (burst {burst * 1000:g} ms)": burst,
             "replag poll (no burst)": 0.0}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, dynomite_cluster(Path(tmp), LAYOUT) as cluster:
        env = {"REPLAG_STORE": f"{tmp}/s.sqlite"}
        config = asyncio.run(cluster.discovered_config(Path(tmp) / "dyn.toml", **env))
        write_port = cluster.nodes[0].client_port
        racks = {f"dc1-rack{i + 1}": node.backend.port for i, node in enumerate(cluster.nodes)}
        p50s: dict[tuple[str, str], list[float]] = {}
        cost: dict[str, list[float]] = {name: [0.0, 0.0, 0.0, 0.0] for name in cases}
        for _ in range(args.rounds):
            for rack, port in racks.items():
                lags = reference(write_port, port, args.keys)
                p50s.setdefault(("reference", rack), []).append(statistics.median(lags))
            for name, burst_s in list(cases.items())[1:]:
                before = backend_figures(cluster)
                report, seconds = asyncio.run(probe(config, args.keys, args.rate, burst_s))
                after = backend_figures(cluster)
                for pair in report.pairs:
                    p50 = pair.summary.lag_ms["p50"]
                    if pair.seen and p50 is not None:
                        p50s.setdefault((name, pair.replica), []).append(float(p50))
                calls = sum(after[p][0] - before[p][0] for p in after)
                cpu = sum(after[p][1] - before[p][1] for p in after)
                keys = args.keys * len(racks)
                for i, add in enumerate((calls / keys, calls / seconds, cpu / keys * 1e6, 1)):
                    cost[name][i] += add
        observers.POLL_BURST_S = burst
    print(f"dynomite, {args.rounds} rounds x {args.keys} keys, load {os.getloadavg()[0]:.1f}:")
    for rack in racks:
        ref = statistics.median(p50s[("reference", rack)])
        line = f"  {rack}: reference p50 {ref:.3f} ms"
        for name in list(cases)[1:]:
            got = statistics.median(p50s.get((name, rack), [float("nan")]))
            line += f"; {name} p50 {got:.3f} ms, ratio {got / ref:.2f}"
        print(line, flush=True)
    for name in list(cases)[1:]:
        per_key, per_s, cpu_us, n = cost[name]
        print(
            f"  cost of {name} on the backends: {per_key / n:.1f} MGET per probe key, "
            f"{per_s / n:,.0f} MGET/s, {cpu_us / n:.1f} us CPU per probe key",
            flush=True,
        )


if __name__ == "__main__":
    main()
