"""A full check against the physical ceiling: 2 and 3 replicas × N keys × 1 KB.

Three independent redis-server processes (`/usr/bin/redis-server` when
present) get the same N keys, then 1,000 injected divergences. For 2 replicas
(the first two servers) and for all 3, `replag repair check` runs as its own
process tree, interleaved with the ceiling: the same servers read completely
at once by a bare pipelined SCAN + MGET, one process per replica. Prints, per
run, wall time, CPU, peak memory (PSS summed over the check's processes: its
scan processes are forked and share pages with it), bytes written to disk and
found/false positives against the ground truth, then the medians, the ratio
to the ceiling, and the store's size and free pages. Targets: ≤ 1.25× the
ceiling, peak memory ≤ 150 MB, ≤ 10 MB written to disk per check.

The injected divergences include expiring keys, so the check reads TTLs (the
script `replag.repair.scan.TTL_SCRIPT`, one PTTL per key inside the server).
Each round therefore also measures the ceiling with TTLs (the same bare
reader, plus that script per batch), and every run prints the servers' own
CPU: what the TTL reads cost the servers, which share the cores here, and the
ratio to the ceiling of reading everything the digest needs.

    python benchmarks/check_ceiling.py [--keys 1000000] [--rounds 3] [--replicas 2,3]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

from ceiling import Ceiling, measure_ceiling
from runstats import Measured, run_measured

from replag.config import load_config, render_config, write_config_atomic
from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.lab.diverge import DivergeSpec, lab_diverge
from replag.lab.load import LoadSpec, lab_load
from replag.repair.observe import key_from_json
from replag.repair.runs import RunLog
from replag.store import Store
from replag.topology import ReplicaGroup, Topology

DEBIAN_REDIS = "/usr/bin/redis-server"
TARGET_RATIO, TARGET_RSS_MB, TARGET_DISK_MB = 1.25, 150.0, 10.0


def topology_of(lab_dir: Path, members: int) -> Path:
    """The lab's topology with its group cut to the first `members` replicas."""
    config = load_config(lab_dir / "topology.toml")
    group = config.topology.groups[0]
    cut = Topology(
        regions=config.topology.regions,
        groups=(ReplicaGroup(name=group.name, members=group.members[:members]),),
    )
    path = lab_dir / f"topology-{members}.toml"
    settings = {"store": str(lab_dir / "replag.sqlite"), "prefix": "replag:probe:"}
    write_config_atomic(path, render_config(cut, settings=settings))
    return path


def cpu_ticks(pids: list[int]) -> int:
    """User + system clock ticks the processes `pids` have used so far."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


class ServerCpu:
    """CPU seconds the servers used during a `with` block."""

    def __init__(self, pids: list[int]) -> None:
        self.pids, self.seconds = pids, 0.0

    def __enter__(self) -> ServerCpu:
        self._start = cpu_ticks(self.pids)
        return self

    def __exit__(self, *_: object) -> None:
        self.seconds = (cpu_ticks(self.pids) - self._start) / os.sysconf("SC_CLK_TCK")


def run_check(config: Path, store_path: Path, truth: set[bytes]) -> tuple[Measured, int, int]:
    measured = run_measured(
        [sys.executable, "-m", "replag", "repair", "check", "--config", str(config), "--json"]
    )
    if measured.returncode not in (0, 1):
        raise SystemExit(f"replag repair check failed: {measured.stderr.strip()[-800:]}")
    run_id = json.loads(measured.stdout)["run_id"]
    store = Store(store_path)
    try:
        keys = {k for k, _, _, _ in RunLog(store, run_id).keys("lab")}
    finally:
        store.close()
    found = len(keys & truth)
    return measured, found, len(keys) - found


def store_pages(path: Path) -> str:
    with sqlite3.connect(path) as db:
        (size,) = db.execute("PRAGMA page_size").fetchone()
        (pages,) = db.execute("PRAGMA page_count").fetchone()
        (free,) = db.execute("PRAGMA freelist_count").fetchone()
    return f"{pages * size / 1e6:.1f} MB, of which {free * size / 1e6:.1f} MB free pages"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", default="2,3")
    args = parser.parse_args()
    if os.access(DEBIAN_REDIS, os.X_OK):
        os.environ.setdefault("REPLAG_REDIS_SERVER", DEBIAN_REDIS)
    with tempfile.TemporaryDirectory(prefix="replag-bench-") as tmp:
        lab_dir = Path(tmp) / "lab"
        state = lab_up(
            lab_dir, LabSpec(regions=("a", "b", "c"), delays_ms={}, engine="independent")
        )
        try:
            ports = [p["port"] for p in state["processes"]]
            bench(args, lab_dir, ports, [p["pid"] for p in state["processes"]])
        finally:
            lab_down(lab_dir)
    return 0


def bench(args: argparse.Namespace, lab_dir: Path, ports: list[int], pids: list[int]) -> None:
    from replag.lab.binary import redis_server_binary, redis_server_version

    version = ".".join(map(str, redis_server_version()))
    print(
        f"independent redis-server {version} ({redis_server_binary()}) × {args.keys:,} keys "
        f"× {args.value_size} B; {os.cpu_count()} cores"
    )
    info = lab_load(lab_dir, LoadSpec(keys=args.keys, value_size=args.value_size))
    print(f"load: {info['seconds']:.1f} s")
    spec = DivergeSpec(missing=250, changed=250, extra=250, type=125, ttl=125, seed=7)
    injected = lab_diverge(lab_dir, spec, None)
    print(f"injected: {injected['total']} divergent keys {injected['counts']}")
    store_path = lab_dir / "replag.sqlite"
    for n in (int(x) for x in args.replicas.split(",")):
        members = injected["members"][:n]
        truth = {key_from_json(d) for d in injected["divergent"] if d["replica"] in members}
        config = topology_of(lab_dir, n)
        checks: list[tuple[Measured, int, int]] = []
        ceilings: dict[bool, list[Ceiling]] = {False: [], True: []}
        server_cpu: dict[str, list[float]] = {"check": [], "ceiling": [], "ttls": []}
        servers = pids[:n]
        order = ("check", "ceiling", "ttls")
        for round_ in range(args.rounds):
            # Rotate which goes first so none always runs on a warmer machine.
            for what in order[round_ % 3 :] + order[: round_ % 3]:
                load = os.getloadavg()[0]
                with ServerCpu(servers) as cpu:
                    if what != "check":
                        ceiling = measure_ceiling(ports[:n], ttls=what == "ttls")
                    else:
                        m, found, false_pos = run_check(config, store_path, truth)
                server_cpu[what].append(cpu.seconds)
                prefix = f"{n} replicas, round {round_ + 1}:"
                servers_used = f"servers' CPU {cpu.seconds:.1f} s"
                if what != "check":
                    ceilings[what == "ttls"].append(ceiling)
                    print(f"{prefix} {ceiling.line()}, {servers_used} (load {load:.2f})")
                    continue
                checks.append((m, found, false_pos))
                print(
                    f"{prefix} check {m.seconds:.2f} s, CPU {m.cpu_s:.1f} s, {servers_used}, "
                    f"peak memory {m.tree_rss_mb:.0f} MB "
                    f"(PSS over its processes; largest RSS {m.max_rss_mb:.0f} MB), "
                    f"disk {m.disk_write_mb:.1f} MB written; found {found}/{len(truth)}, "
                    f"false positives {false_pos} (load {load:.2f})"
                )
        check_s = statistics.median(m.seconds for m, _, _ in checks)
        ceiling_s = statistics.median(c.seconds for c in ceilings[False])
        ttls_s = statistics.median(c.seconds for c in ceilings[True])
        median_cpu = {what: statistics.median(v) for what, v in server_cpu.items()}
        rss = max(m.tree_rss_mb for m, _, _ in checks)
        disk = max(m.disk_write_mb for m, _, _ in checks)
        ratio = check_s / ceiling_s
        verdict = [
            f"≤ {TARGET_RATIO}× ceiling: {'met' if ratio <= TARGET_RATIO else 'MISSED'}",
            f"memory ≤ {TARGET_RSS_MB:.0f} MB: {'met' if rss <= TARGET_RSS_MB else 'MISSED'}",
            f"disk ≤ {TARGET_DISK_MB:.0f} MB: {'met' if disk <= TARGET_DISK_MB else 'MISSED'}",
        ]
        print(
            f"{n} replicas: check median {check_s:.2f} s, ceiling median {ceiling_s:.2f} s, "
            f"ratio {ratio:.2f}; peak memory {rss:.0f} MB; disk written ≤ {disk:.1f} MB per check; "
            + "; ".join(verdict)
        )
        print(
            f"{n} replicas: the TTL reads: ceiling with TTLs median {ttls_s:.2f} s "
            f"({ttls_s / ceiling_s:.2f}× the bare ceiling); check / ceiling with TTLs = "
            f"{check_s / ttls_s:.2f}; servers' CPU median: bare ceiling "
            f"{median_cpu['ceiling']:.1f} s, with TTLs {median_cpu['ttls']:.1f} s, "
            f"check {median_cpu['check']:.1f} s"
        )
    print(f"store after all checks: {store_pages(store_path)}")


if __name__ == "__main__":
    sys.exit(main())
