"""Real Dynomite clusters for tests: `dynomite` processes over real redis-server backends.

The binary is found through $REPLAG_DYNOMITE (`.ci/run` sets it to
../shared/dynomite/bin/dynomite when that exists); without it the tests that need
a cluster skip, saying so. The key files every node's YAML must name are
Dynomite's own sample keys, kept in tests/fixtures/dynomite/conf.

A node answers PING on its client port long before its peer connections are up,
and until they are, DC_ONE writes to a missing peer are dropped silently; so a
cluster is ready only once a write through every node has reached every backend
holding its token.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from replag.config import Config, load_config
from replag.discovery.dynomite import Address, NodePorts, PortMap, discover_dynomite
from replag.lab.server import RedisServer, free_port, stop_pid
from tests.helpers.redis_servers import IN_USE, START_ATTEMPTS, start_redis

DYNOMITE_ENV = "REPLAG_DYNOMITE"
CONF = Path(__file__).resolve().parents[1] / "fixtures" / "dynomite" / "conf"
TOKEN = "12345678"  # the same token in every rack: each rack holds a full replica


class PortTaken(RuntimeError):
    """A node could not bind a port that was free when it was picked (another process,
    e.g. the other xdist worker's, took it meanwhile): the cluster starts again on new ones."""


def dynomite_binary() -> str:
    """The Dynomite binary, or skip the test saying how to get one."""
    path = os.environ.get(DYNOMITE_ENV)
    if not path:
        pytest.skip(f"{DYNOMITE_ENV} is not set (.ci/run sets it to a real Dynomite v0.6.22)")
    if not os.access(path, os.X_OK):
        pytest.skip(f"{DYNOMITE_ENV}={path} is not an executable file")
    return path


def resp2_client(port: int, *, timeout_s: float = 5.0, host: str = "127.0.0.1") -> redis.Redis:
    """A client for a Dynomite client port: RESP2 (Dynomite closes on HELLO 3), no SETINFO."""
    return redis.Redis(
        host=host,
        port=port,
        protocol=2,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        driver_info=None,
    )


@dataclass
class DynomiteNode:
    """One dynomite process and its backend redis-server."""

    name: str
    dc: str
    rack: str
    workdir: Path
    backend: RedisServer
    # Its own loopback address when every node keeps the same ports (one host per node).
    host: str = "127.0.0.1"
    peer_port: int = field(default_factory=free_port)
    client_port: int = field(default_factory=free_port)
    stats_port: int = field(default_factory=free_port)
    token: str = TOKEN
    consistency: str = "DC_ONE"
    stats_interval_ms: int = 5000
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log_from: int = field(default=0, repr=False)  # the log's size when this start began

    @property
    def stats_url(self) -> str:
        return f"http://{self.host}:{self.stats_port}"

    @property
    def client_url(self) -> str:
        return f"redis://{self.host}:{self.client_port}"

    @property
    def peer(self) -> str:
        return f"{self.host}:{self.peer_port}"

    def client(self, *, timeout_s: float = 5.0) -> redis.Redis:
        """A RESP2 client of this node's client port."""
        return resp2_client(self.client_port, timeout_s=timeout_s, host=self.host)

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def yaml(self, others: Sequence[DynomiteNode]) -> str:
        seeds = "".join(f"  - {o.host}:{o.peer_port}:{o.rack}:{o.dc}:{o.token}\n" for o in others)
        return (
            "dyn_o_mite:\n"
            f"  datacenter: {self.dc}\n"
            f"  rack: {self.rack}\n"
            f"  dyn_listen: {self.host}:{self.peer_port}\n"
            f"  dyn_seeds:\n{seeds}"
            f"  listen: {self.host}:{self.client_port}\n"
            f"  servers:\n  - 127.0.0.1:{self.backend.port}:1\n"
            f"  tokens: '{self.token}'\n"
            "  secure_server_option: none\n"
            f"  pem_key_file: {CONF / 'dynomite.pem'}\n"
            f"  recon_key_file: {CONF / 'recon_key.pem'}\n"
            f"  recon_iv_file: {CONF / 'recon_iv.pem'}\n"
            "  data_store: 0\n"
            f"  read_consistency: {self.consistency}\n"
            f"  write_consistency: {self.consistency}\n"
            f"  stats_listen: {self.host}:{self.stats_port}\n"
            f"  stats_interval: {self.stats_interval_ms}\n"
            "  timeout: 5000\n"
        )

    def start(self, binary: str, others: Sequence[DynomiteNode], *, wait_s: float = 15.0) -> None:
        """Start and wait for PING; `PortTaken` if one of its ports was taken meanwhile."""
        conf = self.workdir / f"{self.name}.yml"
        conf.write_text(self.yaml(others))
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        self.process = subprocess.Popen(
            [binary, "-c", str(conf), "-o", str(self.log), "-v", "5"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                error = PortTaken if IN_USE in self._log_since_start() else RuntimeError
                raise error(f"dynomite {self.name} exited at start: {self._log_tail()}")
            try:
                with self.client(timeout_s=1) as client:
                    client.ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"dynomite {self.name} not answering PING: {self._log_tail()}")

    def stop(self) -> None:
        """SIGTERM (then SIGKILL); the backend redis keeps running, as in a rack outage."""
        if self.process is not None:
            stop_pid(self.process.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            self.process = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _log_tail(self) -> str:
        """The end of this start's log, its bind failure first if it had one (Dynomite
        logs a stack trace after it)."""
        text = self._log_since_start()
        failed = [line for line in text.splitlines() if IN_USE in line]
        return "\n".join([*failed[:1], text[-600:]])

    def _log_since_start(self) -> str:
        if not self.log.exists():
            return ""
        with self.log.open("rb") as log:
            log.seek(self._log_from)
            return log.read().decode(errors="replace")


@dataclass
class DynomiteCluster:
    """Nodes started together; `wait_connected()` before trusting a write to reach a peer."""

    binary: str
    nodes: list[DynomiteNode]

    def node(self, name: str) -> DynomiteNode:
        return next(n for n in self.nodes if n.name == name)

    def others(self, node: DynomiteNode) -> list[DynomiteNode]:
        return [n for n in self.nodes if n is not node]

    def port_map(self) -> PortMap:
        """Every node's ports for discovery (several nodes on one host: off convention)."""
        return PortMap(
            overrides={
                n.peer: NodePorts(
                    client=Address("127.0.0.1", n.client_port),
                    redis=Address("127.0.0.1", n.backend.port),
                    stats=Address("127.0.0.1", n.stats_port),
                )
                for n in self.nodes
            }
        )

    async def discovered_config(
        self, path: Path, *, via: str = "node1", extra: str = "", **env: str
    ) -> Config:
        """Discover the cluster from `via`'s stats port, write the TOML (plus `extra`) to
        `path`, load it with `env` (e.g. REPLAG_STORE=…) as its environment."""
        found = await discover_dynomite(
            self.node(via).stats_url, ports=self.port_map(), timeout_s=5
        )
        text = found.render() + extra
        await asyncio.to_thread(path.write_text, text)
        return load_config(path, environ=env)

    def port_map_args(self) -> list[str]:
        """`--port-map` options for `replag topology discover` (every node on one host)."""
        out = []
        for n in self.nodes:
            ports = f"client:{n.client_port},redis:{n.backend.port},stats:{n.stats_port}"
            out += ["--port-map", f"{n.peer}={ports}"]
        return out

    def start(self) -> None:
        for node in self.nodes:
            node.start(self.binary, self.others(node))
        self.wait_connected()

    def restart(self, node: DynomiteNode) -> None:
        node.start(self.binary, self.others(node))
        self.wait_connected()

    def wait_connected(self, *, wait_s: float = 60.0) -> None:
        """Until a write through every running node reaches every running node's backend."""
        running = [n for n in self.nodes if n.running]
        deadline = time.monotonic() + wait_s
        marker = f"replag:harness:{uuid.uuid4().hex[:8]}:"
        for node in running:
            attempt = 0
            while True:
                key = f"{marker}{node.name}:{attempt}"
                with contextlib.suppress(redis.RedisError):
                    with node.client(timeout_s=1) as client:
                        client.set(key, "1")
                    if self._everywhere(key, running):
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dynomite {node.name}: writes do not reach every peer after {wait_s} s"
                    )
                attempt += 1
                time.sleep(0.1)
        for node in self.nodes:  # the markers would read as data to a repair check
            with node.backend.client() as backend:
                for key in backend.scan_iter(match=f"{marker}*"):
                    backend.delete(key)

    @staticmethod
    def _everywhere(key: str, nodes: Sequence[DynomiteNode]) -> bool:
        """`key` on one backend of every rack (a rack of several nodes holds it once)."""
        racks = {(n.dc, n.rack) for n in nodes}
        # Replication is asynchronous under DC_ONE: give the write a moment to land.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            holding = set()
            for n in nodes:
                with n.backend.client() as client:
                    if client.exists(key):
                        holding.add((n.dc, n.rack))
            if holding == racks:
                return True
            time.sleep(0.02)
        return False

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
            node.backend.stop()


Layout = Sequence[tuple[str, str] | tuple[str, str, str]]  # (dc, rack[, token])

# `dynomite_factory(layout=THREE_RACKS, *, consistency="DC_ONE", …)` → a started cluster.
DynomiteFactory = Callable[..., DynomiteCluster]


@contextlib.contextmanager
def dynomite_cluster(
    workdir: Path,
    layout: Layout,
    *,
    consistency: str = "DC_ONE",
    stats_interval_ms: int = 1000,
    backend_args: tuple[str, ...] = ("--notify-keyspace-events", "K$"),
    host_per_node: bool = False,
) -> Iterator[DynomiteCluster]:
    """Start nodes named node1… for `layout`; everything stops after, backends included.

    Keyspace notifications are on in the backends, as replag's push observation
    reads them there (a Dynomite client port cannot subscribe). `host_per_node`: each
    node on a loopback address of its own, all with the same peer, client and stats
    ports (as production runs one node per host), its backend on 127.0.0.1.
    """
    binary = dynomite_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, START_ATTEMPTS + 1):
        cluster = DynomiteCluster(binary=binary, nodes=[])
        try:
            _start_nodes(cluster, workdir, layout, consistency=consistency,
                         stats_interval_ms=stats_interval_ms, backend_args=backend_args,
                         host_per_node=host_per_node)  # fmt: skip
        except PortTaken:
            cluster.stop()
            if attempt == START_ATTEMPTS:
                raise
            continue  # every node on new ports: the peers' seeds name them
        except BaseException:
            cluster.stop()
            raise
        break
    try:
        yield cluster
    finally:
        cluster.stop()


def _start_nodes(
    cluster: DynomiteCluster,
    workdir: Path,
    layout: Layout,
    *,
    consistency: str,
    stats_interval_ms: int,
    backend_args: tuple[str, ...],
    host_per_node: bool,
) -> None:
    """Backends and nodes for `layout` on ports picked now (appended to `cluster.nodes` as
    they start, so a failure stops what started), then the cluster joined."""
    shared = _shared_ports(len(layout)) if host_per_node else None
    for i, (dc, rack, *token) in enumerate(layout, start=1):
        ports = {}
        if shared is not None:
            hosts, (peer, client, stats) = shared
            ports = {"host": hosts[i - 1], "peer_port": peer, "client_port": client,
                     "stats_port": stats}  # fmt: skip
        backend = start_redis(f"backend{i}", workdir, extra_args=backend_args)
        cluster.nodes.append(
            DynomiteNode(
                name=f"node{i}",
                dc=dc,
                rack=rack,
                workdir=workdir,
                backend=backend,
                token=token[0] if token else TOKEN,
                consistency=consistency,
                stats_interval_ms=stats_interval_ms,
                **ports,
            )
        )
    cluster.start()


def _shared_ports(count: int) -> tuple[list[str], tuple[int, int, int]]:
    """`count` loopback addresses of a random 127.a.b.0/24 and three ports free on each."""
    for _ in range(50):
        base = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
        hosts = [f"{base}.{i}" for i in range(1, count + 1)]
        ports = (free_port(), free_port(), free_port())
        if len(set(ports)) == 3 and all(_bindable(h, p) for h in hosts for p in ports):
            return hosts, ports
    raise RuntimeError("no loopback addresses with three free ports in common")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


THREE_RACKS: Layout = (("dc1", "rack1"), ("dc1", "rack2"), ("dc1", "rack3"))
TWO_DCS: Layout = (("dc1", "rack1"), ("dc2", "rack1"))
# Two racks of two nodes: each node owns half of the token ring in its rack.
TWO_RACKS_OF_TWO: Layout = (
    ("dc1", "rack1", "0"),
    ("dc1", "rack1", "2147483648"),
    ("dc1", "rack2", "0"),
    ("dc1", "rack2", "2147483648"),
)
