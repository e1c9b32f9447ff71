"""A fleet lab: N small clusters of real servers (a primary and two replicas each), for
one service watching an estate (`replag lab up --fleet N`) and `benchmarks/fleet.py`.

Each cluster `gNNN` is a region of its own cluster (its probes are observed only on
its replicas) and a replica group of its three servers. Replication is direct on
loopback (no relays): the fleet measures what the service carries, not a WAN.
`lab down` stops it like any lab.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from replag.config import render_config, write_config_atomic
from replag.errors import LabError, UsageError
from replag.lab.cluster import read_state, state_path, wait_replication
from replag.lab.processes import LabProcess, record
from replag.lab.server import RedisServer, free_port, pid_alive, stop_pid
from replag.topology import Endpoint, Region, ReplicaGroup, Topology

REPLICAS = 2


def cluster_name(i: int) -> str:
    return f"g{i:03d}"


def fleet_up(
    lab_dir: Path, clusters: int, *, settings: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Start `clusters` clusters of 3 servers in `lab_dir`, write `topology.toml`; return
    the lab state. Everything started is stopped again if a start fails."""
    if clusters < 1:
        raise UsageError("--fleet: at least 1 cluster")
    lab_dir = lab_dir.resolve()
    lab_dir.mkdir(parents=True, exist_ok=True)
    if state_path(lab_dir).exists():
        running = read_state(lab_dir).get("processes", [])
        if any(pid_alive(p["pid"]) for p in running):
            raise LabError(
                f"a lab is already running in {lab_dir}; `replag lab down --dir {lab_dir}`"
            )
    started: list[dict[str, Any]] = []
    state: dict[str, Any] = {"engine": "fleet", "clusters": clusters, "processes": started}
    try:
        for i in range(clusters):
            name = cluster_name(i)
            primary = _start(lab_dir, started, f"{name}-primary", name, "primary", ())
            for r in range(REPLICAS):
                args = ("--replicaof", "127.0.0.1", str(primary.port))
                _start(lab_dir, started, f"{name}-replica-{r + 1}", name, "replica", args)
        wait_replication(started, timeout_s=60.0 + clusters)
    except BaseException:
        for proc in reversed(started):
            if pid_alive(proc["pid"]):
                stop_pid(proc["pid"])
        raise
    topology = fleet_topology(started)
    write_config_atomic(
        lab_dir / "topology.toml",
        render_config(
            topology,
            settings=settings,
            header=f"replag fleet lab: {clusters} clusters of a primary and {REPLICAS} replicas",
        ),
    )
    state_path(lab_dir).write_text(json.dumps(state, indent=2))
    return state


def _start(
    lab_dir: Path,
    started: list[dict[str, Any]],
    name: str,
    region: str,
    role: str,
    args: tuple[str, ...],
) -> RedisServer:
    server = RedisServer(name=name, port=free_port(), workdir=lab_dir, extra_args=args).start()
    assert server.pid is not None
    record(
        lab_dir,
        started,
        LabProcess(name=name, pid=server.pid, port=server.port, region=region, role=role,
                   kind="redis-server"),
    )  # fmt: skip
    return server


def fleet_topology(processes: list[dict[str, Any]]) -> Topology:
    """One region (of its own cluster) and one replica group per cluster."""
    regions, groups = [], []
    by_cluster: dict[str, list[dict[str, Any]]] = {}
    for proc in processes:
        by_cluster.setdefault(proc["region"], []).append(proc)
    for name, procs in sorted(by_cluster.items()):
        endpoints = {
            p["name"]: Endpoint.from_url(
                f"redis://127.0.0.1:{p['port']}", name=p["name"], region=name
            )
            for p in procs
        }
        primary = next(endpoints[p["name"]] for p in procs if p["role"] == "primary")
        replicas = tuple(endpoints[p["name"]] for p in procs if p["role"] == "replica")
        regions.append(Region(name=name, write=primary, replicas=replicas, cluster=name))
        groups.append(ReplicaGroup(name=name, members=(primary, *replicas)))
    return Topology(regions=tuple(regions), groups=tuple(groups))
