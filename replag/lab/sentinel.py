"""Real Sentinels beside the lab (`redis-server --sentinel`, or valkey-server likewise),
and a forced failover.

Three Sentinels (quorum 2) monitor the lab's primary as master `replag-lab`,
with `down-after-milliseconds` 1000 so a dead primary fails over within
seconds. Their `failover-timeout` is a day: Sentinel "fixes" a replica whose
master address differs from the primary's after that long, and every lab
replica replicates through its delay relay, not from the primary's own port.
`lab_failover` asks Sentinel to fail over (`SENTINEL FAILOVER`), waits until
every Sentinel names the new primary and it answers as one, demotes the old
primary at once (Sentinel would after 8 s) and puts the replication links
back through the delay relay, now towards the new primary.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from replag.errors import LabError
from replag.lab.binary import redis_server_binary
from replag.lab.processes import LabProcess, record
from replag.lab.relay import relay_command
from replag.lab.server import free_port

MASTER_NAME = "replag-lab"
SENTINELS = 3
QUORUM = 2
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 86_400_000


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, decode_responses=True)


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except redis.RedisError:
            pass  # a server restarting or reconfiguring: asked again below
        if time.monotonic() > deadline:
            raise LabError(f"{what} after {timeout_s:.0f}s")
        time.sleep(0.05)


def _sentinel(lab_dir: Path, index: int, primary_port: int) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = lab_dir / f"sentinel-{index}.conf"
    # Sentinel rewrites its file (what it learnt) and needs it writable.
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {lab_dir}\n"
        f"logfile {lab_dir / f'sentinel-{index}.log'}\n"
        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} {QUORUM}\n"
        f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
        f"sentinel parallel-syncs {MASTER_NAME} 16\n"
    )
    process = subprocess.Popen(
        [redis_server_binary(), str(conf), "--sentinel"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return process, port


def start_sentinels(
    lab_dir: Path, primary_port: int, replicas: int, started: list[dict[str, Any]]
) -> list[int]:
    """Start the Sentinels (appended to `started`); return once each knows every replica and
    every other Sentinel, so a failover can be voted and carried out."""
    ports = []
    for index in range(1, SENTINELS + 1):
        process, port = _sentinel(lab_dir, index, primary_port)
        name = f"sentinel-{index}"
        entry = LabProcess(
            name=name, pid=process.pid, port=port, region=None, role="sentinel", kind="sentinel"
        )
        record(lab_dir, started, entry)
        ports.append(port)

    def ready(port: int) -> Callable[[], bool]:
        def check() -> bool:
            with _client(port) as client:
                known = client.execute_command("SENTINEL", "REPLICAS", MASTER_NAME)
                others = client.execute_command("SENTINEL", "SENTINELS", MASTER_NAME)
            return len(known) == replicas and len(others) == SENTINELS - 1

        return check

    for port in ports:
        # Sentinels find each other through hello messages every 2 s.
        _wait(f"Sentinel on port {port} does not see every replica and Sentinel", ready(port), 30)
    return ports


def _fields(entry: Any) -> dict[str, str]:
    if isinstance(entry, dict):
        return {str(k): str(v) for k, v in entry.items()}
    return dict(zip(entry[::2], entry[1::2], strict=False))


def master_port(sentinel_port: int) -> int:
    with _client(sentinel_port) as client:
        _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
    return int(port)


def lab_failover(state: dict[str, Any], *, timeout_s: float = 60) -> dict[str, Any]:
    """Force a Sentinel failover of the lab and re-plumb the delay links; return old/new."""
    sentinels = [p["port"] for p in state["processes"] if p["role"] == "sentinel"]
    if not sentinels:
        raise LabError("this lab has no Sentinels (start it with `replag lab up --sentinel`)")
    started = time.monotonic()
    old_port = master_port(sentinels[0])
    try:
        with _client(sentinels[0]) as client:
            client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
    except redis.RedisError as exc:
        raise LabError(f"Sentinel refused the failover: {exc}") from None

    def switched() -> bool:
        for port in sentinels:
            with _client(port) as client:
                master = _fields(client.execute_command("SENTINEL", "MASTER", MASTER_NAME))
            if int(master["port"]) == old_port or "failover_in_progress" in master["flags"]:
                return False
        with _client(master_port(sentinels[0])) as client:
            return bool(client.info("replication")["role"] == "master")

    _wait("Sentinel did not finish the failover", switched, timeout_s)
    new_port = master_port(sentinels[0])
    servers = {p["port"]: p for p in state["processes"] if p["kind"] == "redis-server"}
    old, new = servers.get(old_port), servers.get(new_port)
    if new is None:
        raise LabError(f"Sentinel promoted 127.0.0.1:{new_port}, which is not a lab server")
    # The old primary, if alive, becomes a replica now rather than in 8 s.
    try:
        with _client(old_port) as client:
            if client.info("replication")["role"] == "master":
                client.execute_command("REPLICAOF", "127.0.0.1", new_port)
    except redis.RedisError:
        pass  # dead: Sentinel converts it when it comes back
    _replumb(state, new_port)
    if old is not None:
        old["role"] = "replica"
    new["role"] = "primary"
    state["primary_port"] = new_port
    return {
        "master": MASTER_NAME,
        "old": {"name": old["name"] if old else None, "port": old_port},
        "new": {"name": new["name"], "port": new_port},
        "seconds": round(time.monotonic() - started, 2),
    }


def _replumb(state: dict[str, Any], new_port: int) -> None:
    """Point every delay link at the new primary and each replica back at its link."""
    control = state.get("relay_control_port")
    if not control:
        return
    for link in state["links"]:
        link["upstream_port"] = new_port
        answer = relay_command(control, {"op": "upstream", "link": link["name"], "port": new_port})
        if not answer.get("ok"):
            raise LabError(f"relay refused to re-point {link['name']}: {answer.get('error')}")
        replica = next(p for p in state["processes"] if p["name"] == link["name"])
        if replica["port"] == new_port:
            continue  # the promoted replica: its link stays idle
        with _client(replica["port"]) as client:
            client.execute_command("REPLICAOF", "127.0.0.1", link["listen_port"])
