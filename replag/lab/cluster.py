"""The local lab: real redis-server processes per region, replication through delay links.

`lab_up` starts a primary in the first region and, in every region, replicas
that replicate from it through the delay relay (a region's one-way delay plus
jitter), waits for every link, writes `DIR/topology.toml` and `DIR/lab.json`
and leaves everything running. `lab_down` stops what `lab.json` lists. With
`engine="independent"` every region gets its own unreplicated Redis (racks of
a Dynomite cluster as repair sees them), written as one replica group.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import redis

from replag.config import render_config, write_config_atomic
from replag.errors import LabError, UsageError
from replag.lab.relay import relay_command
from replag.lab.server import RedisServer, free_port, pid_alive, stop_pid
from replag.topology import Endpoint, Region, ReplicaGroup, Topology

Engine = Literal["replicated", "independent"]
STATE_FILE = "lab.json"
TOPOLOGY_FILE = "topology.toml"
NOTIFY_EVENTS = "K$gx"


@dataclass(frozen=True, kw_only=True)
class LabSpec:
    regions: tuple[str, ...]
    delays_ms: dict[str, float]
    jitter_ms: float = 0.0
    replicas: int = 1
    engine: Engine = "replicated"
    prefix: str = "replag:probe:"
    # The primary's repl-backlog-size (bytes; Redis keeps at least 16 KiB): small makes a
    # partitioned replica's reconnect a full resync after a few writes.
    backlog_bytes: int | None = None

    def __post_init__(self) -> None:
        if len(self.regions) < 2 and self.engine == "independent":
            raise UsageError("--regions: the independent engine needs at least 2 regions")
        if not self.regions:
            raise UsageError("--regions: at least one region")
        if len(set(self.regions)) != len(self.regions):
            raise UsageError("--regions: region names must be distinct")
        unknown = sorted(set(self.delays_ms) - set(self.regions))
        if unknown:
            raise UsageError(f"--delay: {unknown[0]!r} is not one of --regions")
        if self.replicas < 1:
            raise UsageError("--replicas: at least 1")
        if self.backlog_bytes is not None and self.backlog_bytes < 1:
            raise UsageError("--backlog-size: at least 1 byte")


def state_path(lab_dir: Path) -> Path:
    return lab_dir / STATE_FILE


def read_state(lab_dir: Path) -> dict[str, Any]:
    path = state_path(lab_dir)
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise LabError(
            f"no lab in {lab_dir} (no {STATE_FILE}); run `replag lab up` first"
        ) from None
    except (OSError, ValueError) as exc:
        raise LabError(f"cannot read {path}: {exc}") from None


def _pidfile(lab_dir: Path, name: str, pid: int) -> None:
    (lab_dir / f"{name}.pid").write_text(f"{pid}\n")


def lab_up(lab_dir: Path, spec: LabSpec) -> dict[str, Any]:
    """Start the lab described by `spec` in `lab_dir`; return its state. Cleans up on failure."""
    lab_dir = lab_dir.resolve()
    lab_dir.mkdir(parents=True, exist_ok=True)
    if state_path(lab_dir).exists():
        state = read_state(lab_dir)
        if any(pid_alive(p["pid"]) for p in state.get("processes", [])):
            raise LabError(
                f"a lab is already running in {lab_dir}; `replag lab down --dir {lab_dir}`"
            )
    started: list[dict[str, Any]] = []
    try:
        state = _start(lab_dir, spec, started)
    except BaseException:
        for proc in reversed(started):
            stop_pid(proc["pid"])
        raise
    return state


def _start(lab_dir: Path, spec: LabSpec, started: list[dict[str, Any]]) -> dict[str, Any]:
    state: dict[str, Any] = {
        "engine": spec.engine,
        "regions": list(spec.regions),
        "processes": started,
        "links": [],
        "relay_control_port": None,
        "prefix": spec.prefix,
        "jitter_ms": spec.jitter_ms,
        "delays_ms": spec.delays_ms,
    }

    def server(name: str, region: str, role: str, extra: tuple[str, ...] = ()) -> RedisServer:
        srv = RedisServer(name=name, port=free_port(), workdir=lab_dir, extra_args=extra).start()
        assert srv.pid is not None
        started.append(
            {
                "name": name,
                "pid": srv.pid,
                "port": srv.port,
                "region": region,
                "role": role,
                "kind": "redis-server",
            }
        )
        _pidfile(lab_dir, name, srv.pid)
        return srv

    if spec.engine == "independent":
        for region in spec.regions:
            for i in range(spec.replicas):
                server(f"{region}-{i + 1}", region, "independent")
        _write_outputs(lab_dir, spec, state)
        return state

    first = spec.regions[0]
    backlog = ("--repl-backlog-size", str(spec.backlog_bytes)) if spec.backlog_bytes else ()
    primary = server(f"{first}-primary", first, "primary", backlog)
    links = []
    for region in spec.regions:
        for i in range(spec.replicas):
            name = f"{region}-{i + 1}"
            links.append(
                {
                    "name": name,
                    "region": region,
                    "listen_port": 0,
                    "upstream_port": primary.port,
                    "delay_ms": spec.delays_ms.get(region, 0.0),
                    "jitter_ms": spec.jitter_ms,
                    "truth_path": str(lab_dir / f"truth-{name}.log"),
                    "truth_prefix": spec.prefix,
                }
            )
    ready = lab_dir / "relay.ready"
    ready.unlink(missing_ok=True)
    spec_path = lab_dir / "relay.json"
    spec_path.write_text(json.dumps({"links": links, "ready_path": str(ready)}))
    with open(lab_dir / "relay.log", "ab") as log:
        relay = subprocess.Popen(
            [sys.executable, "-m", "replag.lab.relay", str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    started.append(
        {
            "name": "relay",
            "pid": relay.pid,
            "port": None,
            "region": None,
            "role": "relay",
            "kind": "relay",
        }
    )
    _pidfile(lab_dir, "relay", relay.pid)
    deadline = time.monotonic() + 10
    while not ready.exists():
        if relay.poll() is not None or time.monotonic() > deadline:
            raise LabError(f"the delay relay did not start; see {lab_dir / 'relay.log'}")
        time.sleep(0.02)
    control = json.loads(ready.read_text())["control_port"]
    state["relay_control_port"] = control
    status = relay_command(control, {"op": "status"})
    ports = {link["name"]: link["listen_port"] for link in status["links"]}
    for link in links:
        link["listen_port"] = ports[link["name"]]
        server(
            str(link["name"]),
            str(link["region"]),
            "replica",
            (
                "--replicaof",
                "127.0.0.1",
                str(link["listen_port"]),
                "--notify-keyspace-events",
                NOTIFY_EVENTS,
                "--repl-diskless-sync",
                "yes",
                "--repl-diskless-sync-delay",
                "0",
            ),
        )
    state["links"] = links
    wait_replication(started, timeout_s=30 + 0.2 * max(spec.delays_ms.values(), default=0))
    _write_outputs(lab_dir, spec, state)
    return state


def wait_replication(processes: list[dict[str, Any]], *, timeout_s: float) -> None:
    """Return once every replica reports master_link_status:up; LabError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    pending = [p for p in processes if p["role"] == "replica"]
    while pending:
        still = []
        for proc in pending:
            with redis.Redis(port=proc["port"], socket_timeout=2) as client:
                try:
                    info = client.info("replication")
                except redis.RedisError:
                    info = {}
            if info.get("master_link_status") != "up":
                still.append(proc)
        pending = still
        if pending and time.monotonic() > deadline:
            names = ", ".join(p["name"] for p in pending)
            raise LabError(f"replication links not up after {timeout_s:.0f}s: {names}")
        if pending:
            time.sleep(0.05)


def _write_outputs(lab_dir: Path, spec: LabSpec, state: dict[str, Any]) -> None:
    topology = lab_topology(state)
    header = (
        f"replag lab ({spec.engine}) in {lab_dir}\n"
        f"regions: {', '.join(spec.regions)}; one-way delays (ms): "
        f"{json.dumps(spec.delays_ms)}; jitter {spec.jitter_ms} ms"
    )
    settings = {"store": str(lab_dir / "replag.sqlite"), "prefix": spec.prefix}
    write_config_atomic(
        lab_dir / TOPOLOGY_FILE, render_config(topology, settings=settings, header=header)
    )
    tmp = state_path(lab_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_path(lab_dir))


def lab_topology(state: dict[str, Any]) -> Topology:
    def ep(proc: dict[str, Any]) -> Endpoint:
        return Endpoint.from_url(
            f"redis://127.0.0.1:{proc['port']}", name=proc["name"], region=proc["region"]
        )

    servers = [p for p in state["processes"] if p["kind"] == "redis-server"]
    regions = []
    for region in state["regions"]:
        write = next(
            (ep(p) for p in servers if p["region"] == region and p["role"] == "primary"), None
        )
        replicas = tuple(
            ep(p)
            for p in servers
            if p["region"] == region and p["role"] in ("replica", "independent")
        )
        regions.append(Region(name=region, write=write, replicas=replicas))
    group = ReplicaGroup(name="lab", members=tuple(ep(p) for p in servers))
    return Topology(regions=tuple(regions), groups=(group,))


def lab_down(lab_dir: Path) -> list[str]:
    """Stop every process of the lab in `lab_dir`; return the names stopped."""
    state = read_state(lab_dir)
    stopped = []
    for proc in reversed(state.get("processes", [])):
        if pid_alive(proc["pid"]) and _is_ours(proc["pid"], proc["kind"]):
            stop_pid(proc["pid"])
            stopped.append(proc["name"])
        (lab_dir / f"{proc['name']}.pid").unlink(missing_ok=True)
    state_path(lab_dir).unlink(missing_ok=True)
    return stopped


def _is_ours(pid: int, kind: str) -> bool:
    """Guard against a recycled pid: the command line must be what we started."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    marker = b"replag.lab.relay" if kind == "relay" else b"redis-server"
    return marker in cmdline


def lab_status(lab_dir: Path) -> dict[str, Any]:
    state = read_state(lab_dir)
    procs = []
    for proc in state["processes"]:
        row = {k: proc[k] for k in ("name", "region", "role", "port", "pid")}
        row["alive"] = pid_alive(proc["pid"])
        if proc["kind"] == "redis-server" and row["alive"]:
            with redis.Redis(port=proc["port"], socket_timeout=2) as client:
                try:
                    info = client.info("replication")
                    row["link"] = info.get("master_link_status", "-")
                    row["keys"] = client.dbsize()
                except redis.RedisError as exc:
                    row["link"] = f"error: {exc}"
        procs.append(row)
    links = []
    if state.get("relay_control_port"):
        with contextlib.suppress(OSError):
            links = relay_command(state["relay_control_port"], {"op": "status"})["links"]
    return {"dir": str(lab_dir), "engine": state["engine"], "processes": procs, "links": links}


def lab_fault(lab_dir: Path, region: str, op: str, *, delay_ms: float | None = None) -> list[str]:
    """Partition, heal or re-delay every link into `region`; return the links changed."""
    state = read_state(lab_dir)
    if region not in state["regions"]:
        raise UsageError(f"unknown region {region!r} (lab regions: {', '.join(state['regions'])})")
    if not state.get("relay_control_port"):
        raise LabError("this lab has no delay links (engine independent)")
    names = [link["name"] for link in state["links"] if link["region"] == region]
    for name in names:
        request: dict[str, Any] = {"op": op, "link": name}
        if delay_ms is not None:
            request["delay_ms"] = delay_ms
        try:
            answer = relay_command(state["relay_control_port"], request)
        except OSError as exc:
            raise LabError(f"the delay relay does not answer: {exc}") from None
        if not answer.get("ok"):
            raise LabError(f"relay refused {op} on {name}: {answer.get('error')}")
    if op == "delay" and delay_ms is not None:
        state["delays_ms"][region] = delay_ms
        state_path(lab_dir).write_text(json.dumps(state, indent=2))
    return names
