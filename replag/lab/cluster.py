"""The local lab: real redis-server processes per region, replication through delay links.

`lab_up` starts a primary in the first region and, in every region, replicas
that replicate from it through the delay relay (a region's one-way delay plus
jitter), waits for every link, writes `DIR/topology.toml` and `DIR/lab.json`
and leaves everything running. `lab_down` stops what `lab.json` lists. With
`engine="independent"` every region gets its own unreplicated Redis (racks of
a Dynomite cluster as repair sees them), written as one replica group. With
`wan`, the prober (in the first region) reaches every server through its
region's WAN path too (`replag.lab.wan`); by default it reaches them directly.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import redis

from replag.config import render_config, write_config_atomic
from replag.errors import LabError, UsageError
from replag.lab.agents import agent_urls, plan_agents, start_agents
from replag.lab.processes import LabProcess, record
from replag.lab.relay import fill_listen_ports, relay_command, spawn_relay
from replag.lab.sentinel import MASTER_NAME as SENTINEL_MASTER
from replag.lab.sentinel import lab_failover as _failover
from replag.lab.sentinel import master_port as sentinel_master_port
from replag.lab.sentinel import start_sentinels
from replag.lab.server import RedisServer, free_port, pid_alive, stop_pid
from replag.lab.wan import delay_request, start_views, view_ports
from replag.topology import Endpoint, Region, ReplicaGroup, SentinelRef, Topology

Engine = Literal["replicated", "independent"]
STATE_FILE = "lab.json"
TOPOLOGY_FILE = "topology.toml"
NOTIFY_EVENTS = "K$gx"


@dataclass(frozen=True, kw_only=True)
class LabSpec:
    regions: tuple[str, ...]
    # One-way delay from the first region (primary and prober) to each region ("out"), and
    # back where the path is asymmetric (`back_ms`; the same as out where not given).
    delays_ms: dict[str, float]
    back_ms: dict[str, float] = field(default_factory=dict)
    # The prober's view: every server reached through its region's path (WAN geometry),
    # not directly on loopback.
    wan: bool = False
    jitter_ms: float = 0.0
    # How replication links draw their jitter: "uniform" (±jitter_ms) or "pareto" (a
    # heavy tail: late only, by jitter_ms × (Pareto(1.5) − 1), at most 50 × jitter_ms).
    jitter_shape: str = "uniform"
    # A `replag agent` per region (replag.lab.agents), with these clock offsets (ms), and
    # the clock error every lab host states (`clock_error_bound`, ms; None: the kernel's).
    agents: bool = False
    agent_clock_offsets_ms: dict[str, float] = field(default_factory=dict)
    clock_error_bound_ms: float | None = None
    replicas: int = 1
    engine: Engine = "replicated"
    prefix: str = "replag:probe:"
    # The primary's repl-backlog-size (bytes; Redis keeps at least 16 KiB): small makes a
    # partitioned replica's reconnect a full resync after a few writes.
    backlog_bytes: int | None = None
    # Real Sentinels beside the lab (replag.lab.sentinel), so `lab failover` can force one.
    sentinel: bool = False

    def __post_init__(self) -> None:
        if len(self.regions) < 2 and self.engine == "independent":
            raise UsageError("--regions: the independent engine needs at least 2 regions")
        if not self.regions:
            raise UsageError("--regions: at least one region")
        if len(set(self.regions)) != len(self.regions):
            raise UsageError("--regions: region names must be distinct")
        option = "--wan" if self.wan else "--delay"
        unknown = sorted((set(self.delays_ms) | set(self.back_ms)) - set(self.regions))
        if unknown:
            raise UsageError(f"{option}: {unknown[0]!r} is not one of --regions")
        if any(v < 0 for v in [*self.delays_ms.values(), *self.back_ms.values()]):
            raise UsageError(f"{option}: delays cannot be negative")
        unknown = sorted(set(self.agent_clock_offsets_ms) - set(self.regions))
        if unknown:
            raise UsageError(f"--agent-clock-offset: {unknown[0]!r} is not one of --regions")
        if self.agent_clock_offsets_ms and not self.agents:
            raise UsageError("--agent-clock-offset: only with --agents")
        if self.clock_error_bound_ms is not None and self.clock_error_bound_ms < 0:
            raise UsageError("--clock-error-bound: cannot be negative")
        if self.replicas < 1:
            raise UsageError("--replicas: at least 1")
        if self.sentinel and self.engine != "replicated":
            raise UsageError("--sentinel: only a replicated lab has a primary to fail over")
        if self.backlog_bytes is not None and self.backlog_bytes < 1:
            raise UsageError("--backlog-size: at least 1 byte")

    def paths(self) -> dict[str, tuple[float, float]]:
        """Region → (out, back) one-way delays in ms."""
        out = {region: self.delays_ms.get(region, 0.0) for region in self.regions}
        return {region: (ms, self.back_ms.get(region, ms)) for region, ms in out.items()}


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


@dataclass(frozen=True, kw_only=True)
class ReplicationLink:
    """The delay relay's link from the primary to one replica, as the relay reads it."""

    name: str
    region: str
    upstream_port: int
    delay_ms: float  # downstream is primary → replica: the path out
    up_delay_ms: float
    jitter_ms: float
    jitter_shape: str
    truth_path: str
    truth_prefix: str

    def to_dict(self) -> dict[str, Any]:
        # listen_port: 0 asks the relay for a free port (`fill_listen_ports` reads it back).
        return {"kind": "replication", "listen_port": 0, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class _Launcher:
    """Starts the lab's processes, each recorded (`replag.lab.processes`) as soon as it runs."""

    lab_dir: Path
    spec: LabSpec
    started: list[dict[str, Any]]

    def server(self, name: str, region: str, role: str, extra: tuple[str, ...] = ()) -> int:
        """Start a redis-server; return its port."""
        srv = RedisServer(name=name, port=free_port(), workdir=self.lab_dir, extra_args=extra)
        srv.start()
        assert srv.pid is not None
        process = LabProcess(
            name=name, pid=srv.pid, port=srv.port, region=region, role=role, kind="redis-server"
        )
        record(self.lab_dir, self.started, process)
        return srv.port

    def relay(self, links: list[dict[str, Any]]) -> int:
        """Start the delay relay; fill in each link's listen port; return its control port."""
        pid, control = spawn_relay(self.lab_dir, "relay", links)
        process = LabProcess(
            name="relay", pid=pid, port=None, region=None, role="relay", kind="relay"
        )
        record(self.lab_dir, self.started, process)
        fill_listen_ports(control, links)
        return control

    def views(self, state: dict[str, Any]) -> None:
        """With `wan`, the view relay in front of every server: the prober's paths."""
        spec = self.spec
        if spec.wan:
            start_views(
                self.lab_dir,
                state,
                self.started,
                spec.paths(),
                jitter_ms=spec.jitter_ms,
                prefix=spec.prefix,
            )


def _initial_state(spec: LabSpec, started: list[dict[str, Any]]) -> dict[str, Any]:
    """What lab.json holds before anything runs (`started` fills in as processes start)."""
    return {
        "engine": spec.engine,
        "regions": list(spec.regions),
        "processes": started,
        "links": [],
        "relay_control_port": None,
        "prefix": spec.prefix,
        "jitter_ms": spec.jitter_ms,
        "jitter_shape": spec.jitter_shape,
        "delays_ms": spec.delays_ms,
        "back_ms": spec.back_ms,
        "wan": spec.wan,
    }


def _start(lab_dir: Path, spec: LabSpec, started: list[dict[str, Any]]) -> dict[str, Any]:
    state = _initial_state(spec, started)
    if spec.agents:
        plan_agents(state, spec.agent_clock_offsets_ms)
        state["api_token"] = secrets.token_urlsafe(24)
    launch = _Launcher(lab_dir=lab_dir, spec=spec, started=started)
    if spec.engine == "independent":
        for region in spec.regions:
            for i in range(spec.replicas):
                launch.server(f"{region}-{i + 1}", region, "independent")
        launch.views(state)
    else:
        primary_port = _start_replicated(launch, state)
        launch.views(state)
        if spec.sentinel:
            sentinel_ports = start_sentinels(lab_dir, primary_port, len(state["links"]), started)
            state["sentinel"] = {"master": SENTINEL_MASTER, "ports": sentinel_ports}
    _write_outputs(lab_dir, spec, state)
    # Agents read topology.toml; lab.json is written again to list them.
    start_agents(lab_dir, state, started)
    _write_outputs(lab_dir, spec, state)
    return state


def _start_replicated(launch: _Launcher, state: dict[str, Any]) -> int:
    """A primary in the first region and replicas everywhere, each replicating through
    its region's delay link; return once every link is up, with the primary's port."""
    spec = launch.spec
    first = spec.regions[0]
    backlog = ("--repl-backlog-size", str(spec.backlog_bytes)) if spec.backlog_bytes else ()
    # The primary sends its snapshot at once: a diskless sync otherwise waits its default
    # repl-diskless-sync-delay (5 s) for more replicas, and the lab for it.
    primary_port = launch.server(f"{first}-primary", first, "primary", (*backlog, *_SYNC_NOW))
    paths = spec.paths()
    links = [
        ReplicationLink(
            name=f"{region}-{i + 1}",
            region=region,
            upstream_port=primary_port,
            delay_ms=paths[region][0],
            up_delay_ms=paths[region][1],
            jitter_ms=spec.jitter_ms,
            jitter_shape=spec.jitter_shape,
            truth_path=str(launch.lab_dir / f"truth-{region}-{i + 1}.log"),
            truth_prefix=spec.prefix,
        ).to_dict()
        for region in spec.regions
        for i in range(spec.replicas)
    ]
    state["relay_control_port"] = launch.relay(links)
    for link in links:
        launch.server(link["name"], link["region"], "replica", _replica_args(link["listen_port"]))
    state["links"] = links
    slowest = max((sum(path) for path in paths.values()), default=0.0)
    wait_replication(launch.started, timeout_s=30 + 0.1 * slowest)
    return primary_port


def _replica_args(listen_port: int) -> tuple[str, ...]:
    """A replica of the primary as its delay link (listening on `listen_port`) relays it."""
    return (
        "--replicaof",
        "127.0.0.1",
        str(listen_port),
        "--notify-keyspace-events",
        NOTIFY_EVENTS,
        *_SYNC_NOW,
    )


_SYNC_NOW = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")


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
        f"{json.dumps(spec.delays_ms)}; jitter {spec.jitter_ms} ms ({spec.jitter_shape})"
    )
    if spec.back_ms:
        header += f"\nback (region → {spec.regions[0]}) where different: {json.dumps(spec.back_ms)}"
    if spec.wan:
        header += (
            f"\nWAN view: `url` is how a prober in {spec.regions[0]} reaches a server (through "
            "its region's path), `local` is the server's address inside its region"
        )
    settings: dict[str, Any] = {"store": str(lab_dir / "replag.sqlite"), "prefix": spec.prefix}
    if spec.clock_error_bound_ms is not None:
        settings["clock_error_bound"] = f"{spec.clock_error_bound_ms:g}ms"
    if state.get("api_token"):
        settings["api_token"] = state["api_token"]
        offsets = {r: a["offset_ms"] for r, a in state["agents"].items() if a["offset_ms"]}
        header += "\nagents: one `replag agent` per region (`agent` URLs: the prober's view)" + (
            f"; agent clocks shifted (ms): {json.dumps(offsets)}" if offsets else ""
        )
    write_config_atomic(
        lab_dir / TOPOLOGY_FILE, render_config(topology, settings=settings, header=header)
    )
    tmp = state_path(lab_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_path(lab_dir))


def lab_topology(state: dict[str, Any]) -> Topology:
    viewed = view_ports(state)

    def ep(proc: dict[str, Any]) -> Endpoint:
        port = viewed.get(proc["name"], proc["port"])
        endpoint = Endpoint.from_url(
            f"redis://127.0.0.1:{port}", name=proc["name"], region=proc["region"]
        )
        if proc["name"] in viewed:
            endpoint = replace(endpoint, local=("127.0.0.1", int(proc["port"])))
        return endpoint

    servers = [p for p in state["processes"] if p["kind"] == "redis-server"]
    sentinel = None
    if state.get("sentinel"):
        sentinel = SentinelRef(
            master=state["sentinel"]["master"],
            sentinels=tuple(
                Endpoint.from_url(f"redis://127.0.0.1:{port}", name=f"sentinel {port}")
                for port in state["sentinel"]["ports"]
            ),
        )
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
        regions.append(Region(name=region, write=write, replicas=replicas, sentinel=sentinel))
    agents = agent_urls(state)
    regions = [replace(r, agent=agents.get(r.name)) for r in regions]
    group = ReplicaGroup(name="lab", members=tuple(ep(p) for p in servers))
    return Topology(regions=tuple(regions), groups=(group,))


def lab_down(lab_dir: Path) -> list[str]:
    """Stop every process of the lab in `lab_dir`; return the names stopped."""
    state = read_state(lab_dir)
    stopped = []
    for proc in reversed(state.get("processes", [])):
        if proc["kind"] == "postgres":  # the store the lab's services write to: first
            from replag.lab.postgres import stop_lab_postgres

            ours = pid_alive(proc["pid"]) and _is_ours(proc["pid"], proc["kind"])
            stop_lab_postgres(lab_dir, proc["pid"] if ours else None)
            stopped += [proc["name"]] if ours else []
        elif pid_alive(proc["pid"]) and _is_ours(proc["pid"], proc["kind"]):
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
    if kind == "agent":
        return b"replag\x00agent\x00" in cmdline
    if kind == "relay":
        return b"replag.lab.relay" in cmdline
    if kind == "postgres":
        return b"postgres" in cmdline
    # Servers and Sentinels run whichever binary the lab used (REPLAG_REDIS_SERVER).
    return b"redis-server" in cmdline or b"valkey-server" in cmdline


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
        if proc["kind"] == "sentinel" and row["alive"]:
            try:
                row["link"] = f"names primary 127.0.0.1:{sentinel_master_port(proc['port'])}"
            except redis.RedisError as exc:
                row["link"] = f"error: {exc}"
        procs.append(row)
    links = []
    for control in (state.get("relay_control_port"), state.get("view_relay_control_port")):
        if control:
            with contextlib.suppress(OSError):
                links += relay_command(control, {"op": "status"})["links"]
    return {"dir": str(lab_dir), "engine": state["engine"], "processes": procs, "links": links}


def lab_fault(
    lab_dir: Path,
    region: str,
    op: str,
    *,
    delay_ms: float | None = None,
    back_ms: float | None = None,
) -> list[str]:
    """Partition, heal or re-delay every link into `region` (replication links, and in a WAN
    lab the prober's view of its servers); return the links changed. `delay_ms` is the way
    out from the first region, `back_ms` the way back (the same when None)."""
    state = read_state(lab_dir)
    if region not in state["regions"]:
        raise UsageError(f"unknown region {region!r} (lab regions: {', '.join(state['regions'])})")
    targets = [
        (int(control), link)
        for control, links in (
            (state.get("relay_control_port"), state.get("links", [])),
            (state.get("view_relay_control_port"), state.get("views", [])),
        )
        if control
        for link in links
        if link["region"] == region
    ]
    if not targets:
        raise LabError("this lab has no delay links (engine independent, no --wan)")
    for control, link in targets:
        if op == "delay":
            if delay_ms is None:
                raise UsageError("delay: a duration is needed")
            back = delay_ms if back_ms is None else back_ms
            request = delay_request(link, delay_ms, back)
        else:
            request = {"op": op, "link": link["name"]}
        try:
            answer = relay_command(control, request)
        except OSError as exc:
            raise LabError(f"the delay relay does not answer: {exc}") from None
        if not answer.get("ok"):
            raise LabError(f"relay refused {op} on {link['name']}: {answer.get('error')}")
    if op == "delay" and delay_ms is not None:
        state["delays_ms"][region] = delay_ms
        state.setdefault("back_ms", {}).pop(region, None)
        if back_ms is not None and back_ms != delay_ms:
            state["back_ms"][region] = back_ms
        _save_state(lab_dir, state)
    return [link["name"] for _, link in targets]


def lab_failover(lab_dir: Path) -> dict[str, Any]:
    """Force a Sentinel failover (the lab must have `--sentinel`); return old and new primary."""
    state = read_state(lab_dir)
    result = _failover(state)
    _save_state(lab_dir, state)
    return result


def _save_state(lab_dir: Path, state: dict[str, Any]) -> None:
    tmp = state_path(lab_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_path(lab_dir))
