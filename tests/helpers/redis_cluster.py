"""A real Redis Cluster for tests: redis-server nodes started, met, given slots and replicas.

`start_cluster()` does by hand what `redis-cli --cluster create` does (MEET,
ADDSLOTS, REPLICATE) and returns once every node reports cluster_state:ok and
sees every replica in CLUSTER SLOTS. Test modules wrap it in their own fixture.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from replag.lab.server import RedisServer, free_port
from tests.helpers.redis_servers import FAST_SYNC

SLOTS = 16384


@dataclass
class RedisClusterNodes:
    primaries: list[RedisServer]
    replicas: list[RedisServer]  # replicas[i] replicates primaries[i]
    slots: list[tuple[int, int]] = field(default_factory=list)  # slots[i] is primaries[i]'s

    @property
    def url(self) -> str:
        return self.primaries[0].url

    @property
    def nodes(self) -> list[RedisServer]:
        return self.primaries + self.replicas

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def cluster_command(client: redis.Redis, *args: Any) -> Any:
    run: Callable[..., Any] = client.execute_command  # redis-py leaves it untyped
    return run("CLUSTER", *args)


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"Redis Cluster: {what} after {timeout_s:.0f}s")
        time.sleep(0.05)


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000, fixed before Redis 7) is free too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def slot_ranges(count: int) -> list[tuple[int, int]]:
    """Contiguous ranges splitting the slots like redis-cli --cluster create."""
    bounds = [round(i * SLOTS / count) for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(count)]


def start_cluster(
    workdir: Path, *, primaries: int = 3, node_timeout_ms: int = 2000
) -> RedisClusterNodes:
    """`primaries` primaries with one replica each, joined into one cluster, state ok."""
    servers: list[RedisServer] = []
    try:
        for i in range(primaries * 2):
            name = f"cluster{i}"
            servers.append(
                RedisServer(
                    name=name,
                    port=cluster_port(),
                    workdir=workdir,
                    extra_args=(
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        f"nodes-{name}.conf",
                        "--cluster-node-timeout",
                        str(node_timeout_ms),
                        *FAST_SYNC,
                    ),
                ).start()
            )
        cluster = RedisClusterNodes(
            primaries=servers[:primaries],
            replicas=servers[primaries:],
            slots=slot_ranges(primaries),
        )
        _join(cluster)
        return cluster
    except BaseException:
        for server in servers:
            server.stop()
        raise


def _join(cluster: RedisClusterNodes) -> None:
    clients = [node.client() for node in cluster.nodes]
    try:
        ids = [cluster_command(c, "MYID").decode() for c in clients]
        for epoch, client in enumerate(clients, start=1):
            # Distinct epochs up front, as redis-cli does, so no collision round is needed.
            cluster_command(client, "SET-CONFIG-EPOCH", epoch)
        for client, (start, end) in zip(clients, cluster.slots, strict=False):
            cluster_command(client, "ADDSLOTS", *range(start, end + 1))
        for node in cluster.nodes[1:]:
            cluster_command(clients[0], "MEET", "127.0.0.1", node.port)

        def all_known() -> bool:
            for client in clients:
                lines = cluster_command(client, "NODES").decode().splitlines()
                if len(lines) != len(clients) or any("handshake" in line for line in lines):
                    return False
            return True

        _wait("nodes did not all meet", all_known)
        count = len(cluster.primaries)
        for i, client in enumerate(clients[count:]):
            cluster_command(client, "REPLICATE", ids[i])

        def ready() -> bool:
            for client in clients:
                if b"cluster_state:ok" not in cluster_command(client, "INFO"):
                    return False
                entries = cluster_command(client, "SLOTS")
                if len(entries) != count or any(len(e) != 4 for e in entries):
                    return False  # every range listed with its primary and one replica
            return all(
                c.info("replication").get("master_link_status") == "up" for c in clients[count:]
            )

        _wait("cluster_state not ok with every replica linked", ready)
    finally:
        for client in clients:
            with contextlib.suppress(redis.RedisError):
                client.close()


def wait_cluster_ok(cluster: RedisClusterNodes) -> None:
    """Until every running node reports cluster_state:ok (e.g. after a restart)."""

    def ok() -> bool:
        for node in cluster.nodes:
            if node.pid is None:
                continue
            with node.client() as client:
                if b"cluster_state:ok" not in cluster_command(client, "INFO"):
                    return False
        return True

    _wait("cluster_state not ok", ok)
