"""Real Alertmanager and Prometheus processes for the tests, from binaries `.ci/go-tools.sh`
builds once per machine (REPLAG_ALERTMANAGER, REPLAG_PROMETHEUS); tests skip without them."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

HOW = ".ci/go-tools.sh builds it once per machine"


def binary(env: str, name: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"{name} not found: set {env} ({HOW})")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(
    args: list[str], *, ready_url: str, log: Path, verify: Any = True, auth: Any = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `args`, wait until `ready_url` answers 200, stop it on the way out."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"{args[0]} exited {proc.returncode}: {log.read_text()[-2000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, verify=verify, auth=auth, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"{args[0]} not ready: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


ALERTMANAGER_CONFIG = """\
global:
  resolve_timeout: 5m
route:
  receiver: nobody
  group_by: [alertname]
receivers:
  - name: nobody
"""


@contextlib.contextmanager
def alertmanager(
    directory: Path, *, web_config: str | None = None, verify: Any = True, auth: Any = None
) -> Iterator[str]:
    """A real Alertmanager (no cluster) on a free port; yields its base URL."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "am.yml").write_text(ALERTMANAGER_CONFIG)
    port = free_port()
    args = [
        binary("REPLAG_ALERTMANAGER", "alertmanager"),
        f"--config.file={directory / 'am.yml'}",
        f"--storage.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    scheme = "http"
    if web_config is not None:
        (directory / "web.yml").write_text(web_config)
        args.append(f"--web.config.file={directory / 'web.yml'}")
        scheme = "https" if "tls_server_config" in web_config else "http"
    url = f"{scheme}://127.0.0.1:{port}"
    with running(
        args, ready_url=f"{url}/-/ready", log=directory / "am.log", verify=verify, auth=auth
    ):
        yield url
