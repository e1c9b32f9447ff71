"""deploy/compose: the stack up with docker-compose, both serve instances healthy and
sharing the work, then one killed and the other taking everything over.

The users' file names the official postgres and redis images; here they are the
stand-ins built from the local Debian base (no registry), put in by an override file,
with replag's image from deploy/image/build. The stack runs from a copy of
deploy/compose with fresh secrets, its dashboard ports free ones.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from replag.lab.server import free_port
from tests.deploy.docker import PREFIX, ROOT, docker, logs, service_image, wait_healthy

pytestmark = pytest.mark.container

PROJECT = PREFIX + "compose"


def compose_command() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    if probe.returncode == 0:
        return ["docker", "compose"]
    pytest.skip("no docker-compose: apt-get install docker-compose")


class Stack:
    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.command = [*compose_command(), "-p", PROJECT, "-f", "docker-compose.yml",
                        "-f", "test-override.yml"]  # fmt: skip

    def __call__(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run(
            [*self.command, *args], cwd=self.workdir, env=self.env, capture_output=True,
            text=True, timeout=timeout, check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"{' '.join(args)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def container(self, service: str) -> str:
        return self("ps", "-q", service).strip()


@pytest.fixture
def stack(image: str, tmp_path: Path) -> Iterator[tuple[Stack, str, str]]:
    workdir = tmp_path / "compose"
    shutil.copytree(ROOT / "deploy" / "compose", workdir)
    subprocess.run([str(workdir / "make-secrets")], check=True, capture_output=True)
    redis = service_image("redis")
    override: dict[str, Any] = {
        "services": {
            "postgres": {"image": service_image("postgres")},
            "redis-primary": {"image": redis},
            "redis-replica": {"image": redis},
            "agent-eu-west": {"image": image},
            **{
                name: {
                    "image": image,
                    "environment": {"REPLAG_LEASE_TIME": "6s", "REPLAG_PROBE_INTERVAL": "2s"},
                    "healthcheck": {"interval": "2s", "start_period": "60s"},
                }
                for name in ("serve-a", "serve-b")
            },
        }
    }
    (workdir / "test-override.yml").write_text(yaml.safe_dump(override))
    ports = free_port(), free_port()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "REPLAG_PORT_A": str(ports[0]),
           "REPLAG_PORT_B": str(ports[1])}  # fmt: skip
    compose = Stack(workdir, env)
    try:
        compose("up", "-d", "--no-build")
        yield compose, f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"
    finally:
        for service in ("serve-a", "serve-b", "agent-eu-west"):
            print(f"--- {service}\n" + logs(f"{PROJECT}_{service}_1", tail=30))
        compose("down", "-v", "--remove-orphans", timeout=120)


def owners(base: str) -> dict[str, list[str]]:
    """The live instances and the units each owns, as one instance's health says."""
    health = httpx.get(base + "/api/v1/health", timeout=10).json()
    return {i["instance"]: sorted(i["owns"]) for i in health.get("instances", [])}


def poll(what: str, check: Callable[[], bool], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"never happened within {timeout_s:g}s: {what}"
        time.sleep(1)


def test_two_instances_share_the_work_and_one_takes_over_from_a_killed_one(
    stack: tuple[Stack, str, str],
) -> None:
    compose, url_a, url_b = stack
    for service in ("serve-a", "serve-b", "agent-eu-west"):
        wait_healthy(compose.container(service), timeout_s=180)

    before: dict[str, list[str]] = {}

    def shared() -> bool:
        before.clear()
        before.update(owners(url_a))
        return len(before) == 2 and all(before.values())

    poll("both instances owning units", shared)
    # Taken from one answer: a unit given up to share the work is unowned for a moment.
    units = {u for names in before.values() for u in names}
    print("before the kill:", before)

    def measured() -> bool:  # the probes reached the replica, with Redis' password file
        pairs = httpx.get(url_b + "/api/v1/lag?since=5m", timeout=10).json()["pairs"]
        return any(p["target"] == "eu-west" and p["seen"] for p in pairs)

    poll("a probe seen on eu-west", measured)

    compose("kill", "serve-a")  # SIGKILL: no lease is released, they must expire
    survivor = docker("inspect", "-f", "{{.Config.Hostname}}", compose.container("serve-b"))

    def taken_over() -> bool:
        owned = owners(url_b)
        alone = len(owned) == 1 and survivor in next(iter(owned))
        return alone and units <= set(next(iter(owned.values())))

    poll("serve-b owning every unit", taken_over, timeout_s=90)
    print("after the kill:", owners(url_b))
    assert httpx.get(url_b + "/-/ready", timeout=5).status_code == 200
