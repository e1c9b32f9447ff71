"""A region agent's memory against its replica's keyspace: 1M and 3M keys.

One `replag agent` keeps the live tree of one replica (the lab's region a). For
each key count the replica is loaded (pipelined MSET, 100 B values, 13-byte
names), the agent started, and once its tree is current and saved its
`/metrics` are read three times 1.5 s apart (the last reading used):
`replag_agent_resident_bytes` (RSS),
`replag_agent_resident_fixed_bytes` (its RSS when it started, before any
tree), `replag_agent_resident_bytes_per_key` (what it holds beyond that, per
key: the marginal cost), `replag_agent_tree_bytes_per_key` (the key table's
own accounting) and `replag_agent_tree_disk_bytes` (its names file, per key).
Its peak RSS (VmHWM: the full scan's transient) is printed too. Then the keys
of 1,024 leaves are asked for once (the names are read from
disk): its time and keys. The marginal between two counts (RSS difference over
key difference) is printed too, and the peak's. Targets: ≤ 16 B per key at 3M keys;
the first build's peak ≤ 20 B per key.

    python benchmarks/agent_memory.py [--keys 1000000,3000000]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis
from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)
from agents_wan import TOKEN, start_agent, trees, wait_current

from replag.config import load_config, render_config
from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.lab.load import LoadSpec, lab_load
from replag.lab.server import free_port

TARGET = 16.0
PEAK_TARGET = 20.0  # the first build's (the full scan's) peak, marginal


def metrics(port: int) -> dict[str, float]:
    text = httpx.get(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    ).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("replag_agent_") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
    return out


def peak_rss(pid: int) -> float:
    """The process's peak resident set so far (VmHWM), MiB: the full scan's transient."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def leaves_once(port: int, replica: str, count: int) -> tuple[float, int]:
    """Seconds for one `/leaves` request of `count` random leaves, and the keys it held."""
    wanted = sorted(random.Random(7).sample(range(1 << 16), count))
    started = time.perf_counter()
    answer = httpx.post(
        f"http://127.0.0.1:{port}/agent/v1/replicas/{replica}/leaves",
        headers={"Authorization": f"Bearer {TOKEN}"},
        json={"leaves": wanted},
        timeout=120,
    )
    elapsed = time.perf_counter() - started
    answer.raise_for_status()
    return elapsed, int.from_bytes(answer.content[:8], "little")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1000000,3000000")
    args = parse_args(parser, keys="20000,60000")
    counts = [int(x) for x in args.keys.split(",")]
    rows: list[tuple[int, float, float]] = []  # keys, RSS and peak RSS (bytes)
    with tempfile.TemporaryDirectory(prefix="replag-agent-memory-") as tmp:
        workdir = Path(tmp)
        lab_dir = workdir / "lab"
        lab_up(lab_dir, LabSpec(regions=("a", "b"), delays_ms={}, engine="independent"))
        try:
            config = load_config(lab_dir / "topology.toml").topology
            port = free_port()
            agents_toml = workdir / "agent.toml"
            settings = {"store": str(workdir / "replag.sqlite"), "api_token": TOKEN}
            agents_toml.write_text(render_config(config, settings=settings))
            # The agent keeps its tree from keyspace notifications, which the operator
            # turns on (replag does not by default: allow_config_changes = false).
            replica = config.regions[0].replicas[0]
            admin = redis.Redis(host=replica.host, port=replica.port)
            admin.config_set("notify-keyspace-events", "KA")
            for n in counts:
                lab_load(lab_dir, LoadSpec(keys=n, value_size=100))
                proc = start_agent(agents_toml, "a", port, workdir)
                try:
                    try:
                        wait_current({"a": port}, {"a": proc})
                    except SystemExit:
                        print((workdir / "agent-a.log").read_text()[-3000:], file=sys.stderr)
                        raise
                    # Three readings 1.5 s apart (the agent trims freed heap every second):
                    # the last is reported, all three shown.
                    readings = []
                    for i in range(3):
                        time.sleep(1.5 * (i > 0))
                        m = metrics(port)
                        readings.append(m["replag_agent_resident_bytes"] / 2**20)
                    (tree,) = trees(port)
                    seconds, found = leaves_once(port, str(tree["replica"]), 1024)
                    peak = peak_rss(proc.pid)
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
                rss = m["replag_agent_resident_bytes"]
                rows.append((n, rss, peak * 2**20))
                fixed = m["replag_agent_resident_fixed_bytes"]
                load = os.getloadavg()
                print(
                    f"{n:>10,} keys: RSS {rss / 2**20:.1f} MiB, fixed (at start, no tree) "
                    f"{m['replag_agent_resident_fixed_bytes'] / 2**20:.1f} MiB; "
                    f"replag_agent_resident_bytes_per_key "
                    f"{m['replag_agent_resident_bytes_per_key']:.1f} B; key table "
                    f"{m['replag_agent_tree_bytes_per_key']:.1f} B/key in memory, "
                    f"{m['replag_agent_tree_disk_bytes'] / n:.1f} B/key on disk; "
                    f"RSS readings {'/'.join(f'{r:.1f}' for r in readings)} MiB, "
                    f"peak {peak:.1f} MiB (the build's scan: "
                    f"{(peak * 2**20 - fixed) / n:.1f} B/key beyond the fixed); "
                    f"1,024 leaves' keys ({found:,}) in {seconds * 1000:.0f} ms "
                    f"(load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})",
                    flush=True,
                )
        finally:
            lab_down(lab_dir)
    for (n0, r0, p0), (n1, r1, p1) in itertools.pairwise(rows):
        marginal = (r1 - r0) / (n1 - n0)
        peak = (p1 - p0) / (n1 - n0)
        print(
            f"marginal {n0:,} -> {n1:,} keys: {marginal:.1f} B per key "
            f"(≤ {TARGET:.0f}: {'met' if marginal <= TARGET else 'MISSED'}); the first "
            f"build's peak {peak:.1f} B per key (≤ {PEAK_TARGET:.0f}: "
            f"{'met' if peak <= PEAK_TARGET else 'MISSED'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
