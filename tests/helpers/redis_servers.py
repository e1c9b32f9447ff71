"""Real redis-server processes for tests: the factory fixture's type, replicas, replication."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from replag.errors import LabError
from replag.lab.server import RedisServer, free_port
from tests.helpers.waiting import wait_until

# `redis_factory(name="r", *, password=None, extra_args=())` → a started RedisServer.
RedisFactory = Callable[..., RedisServer]

FAST_SYNC = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
# A free port can be taken by another process (the other xdist worker's servers, an
# outgoing connection) between free_port() and the server's bind: a start that fails so
# is tried again on other ports, this many times in all.
START_ATTEMPTS = 5
IN_USE = "Address already in use"


def start_redis(
    name: str,
    workdir: Path,
    *,
    password: str | None = None,
    extra_args: tuple[str, ...] = (),
    port: Callable[[], int] = free_port,
    before_attempt: Callable[[], None] | None = None,
) -> RedisServer:
    """A started RedisServer on a port from `port()`; a start refused because the port
    was taken meanwhile is retried on a new one (`before_attempt` runs before each).

    As a primary it sends its snapshot to a new replica at once (FAST_SYNC, which
    `extra_args` may override): Redis 7 and Valkey wait 5 s by default for more replicas
    before a diskless sync, a wait every replicated test paid."""
    for attempt in range(1, START_ATTEMPTS + 1):
        if before_attempt is not None:
            before_attempt()
        server = RedisServer(
            name=name,
            port=port(),
            workdir=workdir,
            password=password,
            extra_args=(*FAST_SYNC, *extra_args),
        )
        try:
            return server.start()
        except LabError as exc:
            server.stop()
            if attempt == START_ATTEMPTS or not port_taken(str(exc), server.logfile):
                raise
    raise AssertionError("unreachable")


def port_taken(message: str, log: Path) -> bool:
    """Whether a server's start failed on a port in use (its error or its log says so)."""
    if IN_USE in message:
        return True
    try:
        return IN_USE in log.read_text(errors="replace")[-2000:]
    except OSError:
        return False


def replica_of(factory: RedisFactory, upstream: RedisServer, name: str) -> RedisServer:
    return factory(
        name,
        password=upstream.password,
        extra_args=("--replicaof", "127.0.0.1", str(upstream.port), *FAST_SYNC),
    )


def primary_with_a_writable_replica(
    factory: RedisFactory, *, password: str = "pw"
) -> tuple[RedisServer, RedisServer, RedisServer]:
    """(primary, a read-only replica, a `replica-read-only no` replica), with a password,
    replicating and listed online: the newcomer's fleet of issue 46."""
    primary = factory("primary", password=password)
    clean = replica_of(factory, primary, "clean")
    stray = factory(
        "stray",
        password=password,
        extra_args=("--replicaof", "127.0.0.1", str(primary.port), "--masterauth", password,
                    "--replica-read-only", "no"),
    )  # fmt: skip
    wait_listed(primary, [clean, stray])
    return primary, clean, stray


def wait_listed(upstream: RedisServer, replicas: list[RedisServer]) -> None:
    """Until `upstream` lists every one of `replicas` as online, and each replica says its
    link is up and it has loaded the snapshot (a primary lists a replica online once the
    transfer ends, while the replica may still be loading it: LOADING to every read)."""
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
    for replica in replicas:
        with replica.client() as client:

            def in_sync(client: redis.Redis = client) -> bool:
                try:
                    link = client.info("replication")
                    loading = client.info("persistence").get("loading")
                except redis.BusyLoadingError:
                    return False
                return (
                    link.get("master_link_status") == "up"
                    and not link.get("master_sync_in_progress")
                    and not loading
                )

            wait_until(in_sync, f"replica {replica.port} linked and loaded")


@contextmanager
def primary_and_replicas(workdir: Path, replicas: int = 2) -> Iterator[list[RedisServer]]:
    """A primary and its replicas, replicating and listed online: [primary, *replicas].
    For module-scoped fixtures (redis_factory is per test)."""
    servers: list[RedisServer] = []
    try:
        primary = start_redis("primary", workdir)
        servers.append(primary)
        for n in range(replicas):
            args = ("--replicaof", "127.0.0.1", str(primary.port), *FAST_SYNC)
            servers.append(start_redis(f"replica{n}", workdir, extra_args=args))
        wait_listed(primary, servers[1:])
        yield servers
    finally:
        for server in servers:
            server.stop()


def command_calls(client: redis.Redis, command: str) -> int:
    """How many times `command` ran on the server since its stats were reset."""
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
