"""One real `redis-server` process on a free loopback port, started and stopped by us."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from replag.errors import LabError
from replag.lab.binary import redis_server_binary

# Ports below the kernel's ephemeral range, from here up, are where free_port looks first.
_LOWEST_PORT = 10_000


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, picked outside the kernel's ephemeral range where
    it can be. A port from that range (what binding port 0 gives) can be taken as the local
    port of any process's next outgoing connection before the server meant for it binds
    it: with the tests in two workers, an agent then could not listen."""
    first_ephemeral = _ephemeral_range_start()
    if first_ephemeral - _LOWEST_PORT >= 1000:
        for _ in range(100):
            port = random.randrange(_LOWEST_PORT, first_ephemeral)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # unknown (not Linux): port 0's pick


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class RedisServer:
    """A redis-server we started. `stop()` is idempotent; use as a context manager in tests."""

    name: str
    port: int
    workdir: Path
    password: str | None = None
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    pid: int | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}"

    @property
    def logfile(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self, *, wait_s: float = 10.0) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--dbfilename",
            f"{self.name}.rdb",
            "--logfile",
            str(self.logfile),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        args += list(self.extra_args)
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid = self.process.pid
        self._wait_ready(wait_s)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5
        )

    def _wait_ready(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                tail = (
                    self.logfile.read_text(errors="replace")[-400:] if self.logfile.exists() else ""
                )
                raise LabError(f"redis-server {self.name} exited at start: {tail.strip()}")
            try:
                with self.client() as c:
                    c.ping()
                return
            except redis.RedisError as exc:
                last = exc
                time.sleep(0.02)
        self.stop()
        raise LabError(f"redis-server {self.name} on port {self.port} not ready: {last}")

    def stop(self) -> None:
        if self.pid is not None:
            stop_pid(self.pid)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        self.process = None
        self.pid = None

    def kill(self) -> None:
        """Die abruptly, as a crashed server would."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=5)
        self.process = None
        self.pid = None

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; treat it as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


def stop_pid(pid: int, *, timeout_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; reaps our own children."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not pid_alive(pid):
            return
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
