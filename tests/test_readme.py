"""The README's "against your own Redis" lines, exactly as written there, against a
primary and two replicas started here (only the address and the port are ours)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from replag.lab.server import RedisServer, free_port
from tests.helpers.redis_servers import primary_and_replicas
from tests.helpers.waiting import wait_until

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLE_PRIMARY = "redis://127.0.0.1:6379"
EXAMPLE_PORT = "8700"


def own_redis_lines() -> list[str]:
    """The shell lines of the README's block for a primary and its replicas."""
    text = README.read_text()
    block = re.search(
        r"<!-- own-redis: replicas -->\n```sh\n(.*?)```\n<!-- /own-redis -->", text, re.S
    )
    assert block, "README.md lost its own-redis block (or its markers)"
    return [line for line in block.group(1).splitlines() if line.strip()]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[RedisServer]]:
    with primary_and_replicas(tmp_path / "redis") as started:
        yield started


def test_the_readme_lines_work_against_a_primary_and_two_replicas(
    servers: list[RedisServer], tmp_path: Path
) -> None:
    lines = own_redis_lines()
    assert lines[0].startswith(f"PRIMARY={EXAMPLE_PRIMARY}") and "serve" in lines[-1]
    port = str(free_port())
    ours = [
        line.replace(EXAMPLE_PRIMARY, servers[0].url).replace(EXAMPLE_PORT, port) for line in lines
    ]
    env = {**os.environ, "REPLAG_STORE": str(tmp_path / "store.sqlite")}
    # Every line but serve, in one shell, stopping at the first that fails.
    steps = "set -e\n" + "\n".join(ours[:-1]) + "\n"
    done = subprocess.run(["bash", "-c", steps], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    config = (tmp_path / "replag.toml").read_text()
    assert all(f"127.0.0.1:{s.port}" in config for s in servers)
    assert "SAFE" in done.stderr and "0 divergent keys" in done.stdout
    serve = subprocess.Popen(
        ["bash", "-c", f"exec {ours[-1]}"], cwd=tmp_path, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def measured() -> bool:
            assert serve.poll() is None, serve.stderr.read() if serve.stderr else ""
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/api/v1/health").json()
            except httpx.TransportError:
                return False
            return len(health["pairs"]) == 1 and health["status"] == "ok"

        wait_until(measured, "serve probing the replicas", timeout_s=120)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=30)
    assert serve.returncode == 0
