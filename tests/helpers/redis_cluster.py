"""A real Redis Cluster for tests: redis-server nodes started, met, given slots and replicas.

`start_cluster()` does by hand what `redis-cli --cluster create` does (MEET,
ADDSLOTS, REPLICATE) and returns once the cluster is whole as every node sees it:
cluster_state:ok with all 16384 slots assigned and ok, every slot range listed in
CLUSTER SLOTS with its primary and one replica, every replica's link up. Gossip on
a loaded host is slow, so the wait is long (`READY_TIMEOUT_S` only bounds a hang)
and its failure names what was still missing. Test modules wrap it in their own
fixture.
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
from replag.repair.keyspace.slots import key_slot
from tests.helpers.redis_servers import FAST_SYNC, start_redis

SLOTS = 16384
# How long a cluster may take to become whole: only a hang reaches it (nodes meet and
# agree by gossip, which a starved host runs late, not wrong).
READY_TIMEOUT_S = 300.0


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


def _wait(what: str, missing: Callable[[], str | None]) -> None:
    """Until `missing()` is None (it says what is still missing otherwise); a node that
    does not answer in time (a loaded host) is asked again, never a failure by itself."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            still = missing()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            still = f"a node did not answer ({exc})"
        if still is None:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"Redis Cluster: {what} after {READY_TIMEOUT_S:.0f}s: {still}")
        time.sleep(0.1)


def _whole(client: redis.Redis, primaries: int, *, replicas: bool) -> str | None:
    """What this node does not see yet of a whole cluster (None: nothing)."""
    info = cluster_command(client, "INFO").decode()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    port = client.connection_pool.connection_kwargs.get("port")
    if fields.get("cluster_state") != "ok":
        return f"node {port}: cluster_state:{fields.get('cluster_state')}"
    for name in ("cluster_slots_assigned", "cluster_slots_ok"):
        if fields.get(name) != str(SLOTS):
            return f"node {port}: {name}:{fields.get(name)}"
    if replicas:
        entries = cluster_command(client, "SLOTS")
        serving = {int(e[2][1]) for e in entries}
        if len(serving) != primaries or any(len(e) != 4 for e in entries):
            return (
                f"node {port}: CLUSTER SLOTS lists {len(serving)} primaries in "
                f"{len(entries)} ranges, not each with a replica"
            )
    return None


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
    workdir: Path,
    *,
    primaries: int = 3,
    node_timeout_ms: int = 2000,
    extra_args: tuple[str, ...] = (),
) -> RedisClusterNodes:
    """`primaries` primaries with one replica each, joined into one cluster, state ok
    (`extra_args`: more server options, e.g. Valkey 9's `--cluster-databases 4`)."""
    servers: list[RedisServer] = []
    try:
        for i in range(primaries * 2):
            name = f"cluster{i}"
            conf = workdir / f"nodes-{name}.conf"
            servers.append(
                start_redis(
                    name,
                    workdir,
                    port=cluster_port,
                    # A node that failed to bind may have written its config: a new node.
                    before_attempt=lambda conf=conf: conf.unlink(missing_ok=True),
                    extra_args=(
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        conf.name,
                        "--cluster-node-timeout",
                        str(node_timeout_ms),
                        *FAST_SYNC,
                        *extra_args,
                    ),
                )
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

        def unmet() -> str | None:
            for client in clients:
                lines = cluster_command(client, "NODES").decode().splitlines()
                if len(lines) != len(clients) or any("handshake" in line for line in lines):
                    port = client.connection_pool.connection_kwargs.get("port")
                    return f"node {port} knows {len(lines)} of {len(clients)} nodes"
            return None

        _wait("nodes did not all meet", unmet)
        count = len(cluster.primaries)
        for i, client in enumerate(clients[count:]):
            cluster_command(client, "REPLICATE", ids[i])
    finally:
        for client in clients:
            with contextlib.suppress(redis.RedisError):
                client.close()
    wait_cluster_whole(cluster)


def wait_cluster_whole(cluster: RedisClusterNodes) -> None:
    """Until every node sees every slot served, each range with its replica, and every
    replica's link up, with `cluster.primaries` the primaries (after a failover and
    back, say: a shard's replica is listed again only once gossip has its offset)."""
    clients = [node.client() for node in cluster.nodes]
    count = len(cluster.primaries)
    moved: set[int] = set()

    def not_ready() -> str | None:
        _move_offsets(cluster, clients[:count], moved)
        for client in clients:
            if (still := _whole(client, count, replicas=True)) is not None:
                return still
        for client in clients[count:]:
            if client.info("replication").get("master_link_status") != "up":
                port = client.connection_pool.connection_kwargs.get("port")
                return f"replica {port}: link to its primary not up"
        return None

    try:
        _wait("not whole", not_ready)
    finally:
        for client in clients:
            with contextlib.suppress(redis.RedisError):
                client.close()


def _move_offsets(
    cluster: RedisClusterNodes, primaries: list[redis.Redis], moved: set[int]
) -> None:
    """A write (then its delete) on each primary not in `moved` yet, once it takes one.
    Redis 7 lists a replica in CLUSTER SLOTS only once gossip says its replication offset
    is not 0, and a new primary's stays 0 until a write or its first PING to its replicas
    (repl-ping-replica-period, 10 s)."""
    for i, (client, (first, last)) in enumerate(zip(primaries, cluster.slots, strict=True)):
        if i in moved:
            continue
        keys = (f"replag:harness:{n}".encode() for n in range(100_000))
        key = next(k for k in keys if first <= key_slot(k) <= last)
        with contextlib.suppress(redis.ResponseError):  # CLUSTERDOWN: not yet
            client.set(key, b"1")
            client.delete(key)
            moved.add(i)


def wait_cluster_ok(cluster: RedisClusterNodes) -> None:
    """Until every running node reports cluster_state:ok with every slot served (e.g.
    after a restart)."""

    def not_ok() -> str | None:
        for node in cluster.nodes:
            if node.pid is None:
                continue
            with node.client() as client:
                if (still := _whole(client, len(cluster.primaries), replicas=False)) is not None:
                    return still
        return None

    _wait("cluster_state not ok", not_ok)
