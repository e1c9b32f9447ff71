"""A full check against the physical ceiling: 2 and 3 replicas × N keys × 1 KB.

Three independent redis-server processes (`/usr/bin/redis-server` when
present) get the same N keys, then 1,000 injected divergences. For 2 replicas
(the first two servers) and for all 3, `replag repair check` runs as its own
process tree, interleaved with the ceiling: the same servers read completely
at once by a bare pipelined SCAN + MGET, one process per replica. Prints, per
run, wall time, CPU, peak memory (PSS summed over the check's processes: its
scan processes are forked and share pages with it), bytes written to disk and
found/false positives against the ground truth, then the medians, the ratio
to the ceiling, and the store's size and free pages. Timed runs go without the
memory sampler (it costs a check on 2 cores 7%, and the ceiling has none);
peak memory comes from one more run of each check, sampled. Targets: ≤ 1.25× the
ceiling, peak memory ≤ 150 MB, ≤ 10 MB written to disk per check.

Two checks run: the default, which compares expiries, and `--ttls ignore`,
which compares values only and so reads what the bare ceiling reads. The
injected divergences include expiring keys, so the default check reads TTLs.
Each round therefore also measures the ceiling with TTLs three ways a user
could write without replag (see ceiling.py: a PTTL per key pipelined, a script
returning every PTTL, a script returning only the set ones); the fastest of the
three (by median) is the TTL ceiling. The bare ceiling stays the headline ratio
for both checks; the default check's ratio to the TTL ceiling is printed beside
it. Every run prints the servers' own CPU: what the TTL reads cost the servers,
which share the cores here.

Every reader runs at the same CPU priority: the check's scan processes at
`scan_nice = 0` (the setting's default is 10, which would let the ceilings'
readers, at 0, take the cores first on a shared host), the ceilings' at nice 0.
Each verdict line carries what the check found against the injected truth.
The ceilings' readers are started and connected before their clock starts; a
check is timed from its command's start to its exit, and its line also shows
its in-process run and slowest scan, so the start-up's share can be read off.
replag's modules are compiled to bytecode first, as an install compiles them: run
from a source tree where PYTHONDONTWRITEBYTECODE is set (as in this project's
sessions), every check would otherwise compile about 90 modules at its start (70 ms
of CPU measured), which no installed replag does.

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

from _smoke import parse_args  # --smoke: tiny sizes, same path (tests/test_benchmarks.py)
from ceiling import TTL_METHODS, Ceiling, measure_ceiling
from runstats import Measured, run_measured

from replag.config import load_config, render_config, write_config_atomic
from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.lab.diverge import DivergeSpec, lab_diverge
from replag.lab.load import LoadSpec, lab_load
from replag.repair.keyspace.observe import key_from_json
from replag.repair.runs import RunLog
from replag.store import Store
from replag.topology import ReplicaGroup, Topology

DEBIAN_REDIS = "/usr/bin/redis-server"
TARGET_RATIO, TARGET_RSS_MB, TARGET_DISK_MB = 1.25, 150.0, 10.0
NICE = 0  # every reader's CPU priority: the check's scan processes and the ceilings'


def compile_bytecode() -> int:
    """Compile replag's modules to bytecode beside them (`__pycache__`, as pip does on
    install); how many modules there are."""
    import compileall

    import replag

    root = Path(replag.__file__).parent
    if not compileall.compile_dir(root, quiet=1):
        raise SystemExit(f"compiling {root} to bytecode failed")
    return sum(1 for _ in root.rglob("*.py"))


def topology_of(lab_dir: Path, members: int, extra: dict[str, object] | None = None) -> Path:
    """The lab's topology with its group cut to the first `members` replicas (and the
    settings `extra` beside the benchmark's own)."""
    config = load_config(lab_dir / "topology.toml")
    group = config.topology.groups[0]
    cut = Topology(
        regions=config.topology.regions,
        groups=(ReplicaGroup(name=group.name, members=group.members[:members]),),
    )
    path = lab_dir / f"topology-{members}.toml"
    settings = {
        "store": str(lab_dir / "replag.sqlite"),
        "prefix": "replag:probe:",
        "scan_nice": NICE,
        **(extra or {}),
    }
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


def run_check(
    config: Path, store_path: Path, truth: set[bytes], *, ttls: str, sample_memory: bool
) -> tuple[Measured, int, int]:
    argv = [sys.executable, "-m", "replag", "repair", "check", "--config", str(config)]
    measured = run_measured([*argv, "--json", "--ttls", ttls], sample_memory=sample_memory)
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
    args = parse_args(parser, keys=5000, value_size=64, rounds=1, replicas="2")
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


# The two checks: expiries compared (the default) or not (--ttls ignore: what the bare
# ceiling reads, and RedisFullCheck's exactness).
CHECKS = {"check": "compare", "values": "ignore"}
LABELS = {"check": "check", "values": "check --ttls ignore"}
CEILINGS = ("bare", *TTL_METHODS)


def bench(args: argparse.Namespace, lab_dir: Path, ports: list[int], pids: list[int]) -> None:
    from replag.lab.binary import redis_server_binary, redis_server_version

    version = ".".join(map(str, redis_server_version()))
    print(
        f"independent redis-server {version} ({redis_server_binary()}) × {args.keys:,} keys "
        f"× {args.value_size} B; {os.cpu_count()} cores"
    )
    print(f"replag's {compile_bytecode()} modules compiled to bytecode, as an install does")
    info = lab_load(lab_dir, LoadSpec(keys=args.keys, value_size=args.value_size))
    print(f"load: {info['seconds']:.1f} s")
    spec = DivergeSpec(missing=250, changed=250, extra=250, type=125, ttl=125, seed=7)
    injected = lab_diverge(lab_dir, spec, None)
    print(f"injected: {injected['total']} divergent keys {injected['counts']}")
    store_path = lab_dir / "replag.sqlite"
    for n in (int(x) for x in args.replicas.split(",")):
        members = injected["members"][:n]
        mine = [d for d in injected["divergent"] if d["replica"] in members]
        truth = {
            "check": {key_from_json(d) for d in mine},
            # A TTL alone is not looked for without expiries.
            "values": {key_from_json(d) for d in mine if d["injected"] != "ttl"},
        }
        config = topology_of(lab_dir, n)
        runs: dict[str, list[tuple[Measured, int, int]]] = {"check": [], "values": []}
        ceilings: dict[str, list[Ceiling]] = {c: [] for c in CEILINGS}
        server_cpu: dict[str, list[float]] = {what: [] for what in (*CHECKS, *CEILINGS)}
        servers = pids[:n]
        order = (*CHECKS, *CEILINGS)
        for round_ in range(args.rounds):
            # Rotate which goes first so none always runs on a warmer machine.
            shift = round_ % len(order)
            for what in order[shift:] + order[:shift]:
                load = os.getloadavg()[0]
                with ServerCpu(servers) as cpu:
                    if what in CEILINGS:
                        method = None if what == "bare" else what
                        ceiling = measure_ceiling(ports[:n], ttls=method, nice=NICE)
                    else:
                        # Timed without the memory sampler, as the ceiling is (see runstats).
                        run = run_check(
                            config, store_path, truth[what], ttls=CHECKS[what], sample_memory=False
                        )
                server_cpu[what].append(cpu.seconds)
                prefix = f"{n} replicas, round {round_ + 1}:"
                servers_used = f"servers' CPU {cpu.seconds:.1f} s"
                if what in CEILINGS:
                    ceilings[what].append(ceiling)
                    print(f"{prefix} {ceiling.line()}, {servers_used} (load {load:.2f})")
                    continue
                m, found, false_pos = run
                runs[what].append(run)
                inside = json.loads(m.stdout)
                scans = max(r["scan_s"] for r in inside["replicas"])
                print(
                    f"{prefix} {LABELS[what]} {m.seconds:.2f} s (in the process: run "
                    f"{inside['seconds']:.2f} s, slowest scan {scans:.2f} s; the rest is "
                    f"start-up and exit), CPU {m.cpu_s:.1f} s, "
                    f"{servers_used}, disk {m.disk_write_mb:.1f} MB written; "
                    f"found {found}/{len(truth[what])}, false positives {false_pos} "
                    f"(load {load:.2f})"
                )
        # Memory: one more run of each, with PSS sampled every 20 ms.
        memory = {
            what: run_check(config, store_path, truth[what], ttls=CHECKS[what], sample_memory=True)
            for what in CHECKS
        }
        for what, (m, found, _) in memory.items():
            print(
                f"{n} replicas, memory run: {LABELS[what]} {m.seconds:.2f} s (sampled), peak "
                f"memory {m.tree_rss_mb:.0f} MB (PSS over its processes; largest RSS "
                f"{m.max_rss_mb:.0f} MB), disk {m.disk_write_mb:.1f} MB; found {found}"
            )
        sizes = {what: len(keys) for what, keys in truth.items()}
        summarize(n, runs, sizes, ceilings, server_cpu, memory)
    print(f"store after all checks: {store_pages(store_path)}")


def correctness(runs: list[tuple[Measured, int, int]], truth: int) -> str:
    """What every timed run found: one figure where they agree, the range where not."""
    found = sorted({f for _, f, _ in runs})
    false_pos = sorted({fp for _, _, fp in runs})
    got = f"{found[0]}" if len(found) == 1 else f"{found[0]}-{found[-1]}"
    fps = f"{false_pos[0]}" if len(false_pos) == 1 else f"{false_pos[0]}-{false_pos[-1]}"
    return f"found {got}/{truth} in {len(runs)} runs, false positives {fps}"


def summarize(
    n: int,
    runs: dict[str, list[tuple[Measured, int, int]]],
    truth: dict[str, int],
    ceilings: dict[str, list[Ceiling]],
    server_cpu: dict[str, list[float]],
    memory: dict[str, tuple[Measured, int, int]],
) -> None:
    median_s = {what: statistics.median(m.seconds for m, _, _ in r) for what, r in runs.items()}
    ceiling_s = {what: statistics.median(c.seconds for c in cs) for what, cs in ceilings.items()}
    bare_s = ceiling_s["bare"]
    ttl_method = min(TTL_METHODS, key=ceiling_s.__getitem__)
    ttls_s = ceiling_s[ttl_method]
    cpu = {what: statistics.median(v) for what, v in server_cpu.items()}
    rss = max(m.tree_rss_mb for m, _, _ in memory.values())
    disk = max(m.disk_write_mb for r in [*runs.values(), list(memory.values())] for m, _, _ in r)

    def verdict(ratio: float) -> str:
        return "met" if ratio <= TARGET_RATIO else "MISSED"

    methods = ", ".join(f"{m} {ceiling_s[m]:.2f} s" for m in TTL_METHODS)
    print(
        f"{n} replicas, ceilings (medians, every reader at nice {NICE}): bare "
        f"{bare_s:.2f} s; with TTLs {methods}: the fastest, {ttl_method}, is the TTL "
        f"ceiling ({ttls_s / bare_s:.2f}× the bare one)"
    )
    values = median_s["values"] / bare_s
    print(
        f"{n} replicas, expiries not compared (--ttls ignore: the values, as the bare ceiling "
        f"reads them): check median {median_s['values']:.2f} s, ratio {values:.2f} to the "
        f"bare ceiling (≤ {TARGET_RATIO}×: {verdict(values)}); "
        f"{correctness(runs['values'], truth['values'])}"
    )
    default, with_ttls = median_s["check"] / bare_s, median_s["check"] / ttls_s
    print(
        f"{n} replicas, expiries compared (the default): check median {median_s['check']:.2f} "
        f"s, ratio {default:.2f} to the bare ceiling (≤ {TARGET_RATIO}×: {verdict(default)}), "
        f"{with_ttls:.2f} to the TTL ceiling ({ttl_method}; ≤ {TARGET_RATIO}×: "
        f"{verdict(with_ttls)}); {correctness(runs['check'], truth['check'])}"
    )
    servers = ", ".join(f"{what} {cpu[what]:.1f} s" for what in CEILINGS)
    print(
        f"{n} replicas: peak memory {rss:.0f} MB (≤ {TARGET_RSS_MB:.0f} MB: "
        f"{'met' if rss <= TARGET_RSS_MB else 'MISSED'}); disk written ≤ {disk:.1f} MB per "
        f"check (≤ {TARGET_DISK_MB:.0f} MB: {'met' if disk <= TARGET_DISK_MB else 'MISSED'}); "
        f"servers' CPU medians: ceilings {servers}, check {cpu['check']:.1f} s, "
        f"check --ttls ignore {cpu['values']:.1f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
