"""Real redis-server processes for tests: the factory fixture's type, replicas, replication."""

from __future__ import annotations

from collections.abc import Callable

from replag.lab.server import RedisServer
from tests.helpers.waiting import wait_until

# `redis_factory(name="r", *, password=None, extra_args=())` → a started RedisServer.
RedisFactory = Callable[..., RedisServer]

FAST_SYNC = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")


def replica_of(factory: RedisFactory, upstream: RedisServer, name: str) -> RedisServer:
    return factory(
        name,
        password=upstream.password,
        extra_args=("--replicaof", "127.0.0.1", str(upstream.port), *FAST_SYNC),
    )


def wait_listed(upstream: RedisServer, replicas: list[RedisServer]) -> None:
    """Until `upstream` lists every one of `replicas` as online."""
    want = {r.port for r in replicas}
    with upstream.client() as client:

        def online() -> bool:
            info = client.info("replication")
            listed = {
                v["port"]
                for k, v in info.items()
                if k.startswith("slave") and isinstance(v, dict) and v["state"] == "online"
            }
            return want <= listed

        wait_until(online, f"replicas {sorted(want)} online on {upstream.port}")
