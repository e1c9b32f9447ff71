"""Docker for the container tests: the daemon, the local Debian base, replag's image.

No registry is reachable where these run, so every image starts from a Debian base
made with debootstrap (`deploy/image/debian-base`), built once per machine and kept by
its tag. A daemon that is not running is started when the tests may (root, `dockerd`
installed) and stopped again after them. Anything missing skips with a message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = os.environ.get("REPLAG_TEST_BASE_IMAGE", "replag-base:bookworm")
IMAGE = "replag:test"
PREFIX = "replag-test-"  # every container and network the tests make is named with it


def docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    """`docker ARGS`' stdout; a failure shows its stderr."""
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def _daemon_answers() -> bool:
    try:
        subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=True)
    except (subprocess.SubprocessError, OSError):
        return False
    return True


@contextmanager
def docker_daemon() -> Iterator[None]:
    """A Docker daemon for the tests' duration: the running one, or one started here."""
    if shutil.which("docker") is None:
        pytest.skip("no docker client: apt-get install docker.io")
    if _daemon_answers():
        yield
        return
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip("no Docker daemon running, and none can be started here (root, dockerd)")
    log = open(os.environ.get("TMPDIR", "/tmp") + "/replag-test-dockerd.log", "ab")  # noqa: SIM115
    daemon = subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _daemon_answers():
            if daemon.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"dockerd did not start (see {log.name})")
            time.sleep(0.5)
        yield
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        log.close()


def base_image() -> str:
    """The Debian base, made once per machine (`deploy/image/debian-base`)."""
    if subprocess.run(["docker", "image", "inspect", BASE], capture_output=True).returncode == 0:
        return BASE
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        pytest.skip(f"no {BASE} image, and it cannot be made here (root, debootstrap)")
    run([str(ROOT / "deploy" / "image" / "debian-base"), BASE], timeout=1200)
    return BASE


def replag_image() -> str:
    """replag's image on the base, built by `deploy/image/build` from this checkout."""
    run([str(ROOT / "deploy" / "image" / "build"), base_image(), IMAGE], timeout=1200)
    return IMAGE


def run(args: Sequence[str], *, timeout: float, cwd: Path = ROOT) -> str:
    result = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
    )
    assert result.returncode == 0, f"{' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def remove_leftovers() -> None:
    """Containers and networks an earlier, interrupted run left behind."""
    names = docker("ps", "-aq", "--filter", f"name={PREFIX}")
    if names:
        docker("rm", "-f", *names.split())
    networks = docker("network", "ls", "-q", "--filter", f"name={PREFIX}")
    if networks:
        docker("network", "rm", *networks.split(), check=False)


def wait_healthy(container: str, timeout_s: float = 120) -> None:
    """Until Docker says the container's HEALTHCHECK passes; its logs when it never does."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = docker("inspect", "-f", "{{.State.Status}} {{.State.Health.Status}}", container)
        if state == "running healthy":
            return
        # Not only "running": a container may be restarted by its policy meanwhile.
        if time.monotonic() > deadline:
            raise AssertionError(f"{container} is {state}, not healthy:\n{logs(container)}")
        time.sleep(1)


def logs(container: str, tail: int = 40) -> str:
    """The container's last lines, stdout and stderr together."""
    result = subprocess.run(
        ["docker", "logs", "--tail", str(tail), container],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return result.stdout + result.stderr


IMAGES = ROOT / "tests" / "deploy" / "images"
POSTGRES = "replag-test-postgres:15"
REDIS = "replag-test-redis:7"


def service_image(kind: str) -> str:
    """PostgreSQL or Redis from Debian on the local base (`tests/deploy/images/KIND`), the
    stand-ins for the official images where no registry is reachable. Docker's layer cache
    keeps them: only the first build per machine fetches Debian packages (from the host's
    network: `--network host`)."""
    tag = {"postgres": POSTGRES, "redis": REDIS}[kind]
    run(["docker", "build", "--quiet", "--network", "host", "--build-arg",
         f"BASE_IMAGE={base_image()}", "--tag", tag, str(IMAGES / kind)], timeout=900)  # fmt: skip
    return tag


def wait_postgres(container: str, timeout_s: float = 60) -> None:
    """Until PostgreSQL in `container` accepts connections over TCP."""
    deadline = time.monotonic() + timeout_s
    probe = ["docker", "exec", container, "pg_isready", "-q", "-h", "127.0.0.1"]
    while subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"{container}: PostgreSQL not ready:\n{logs(container)}")
        time.sleep(0.5)
