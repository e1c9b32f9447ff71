"""replag's image, built by deploy/image/build on the local Debian base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.deploy.docker import BASE, PREFIX, docker, logs, wait_healthy

pytestmark = pytest.mark.container

CONFIG = """\
[settings]
probe_interval = "2s"
timeout = "500ms"

[[regions]]
name = "us-east"
write = "redis://127.0.0.1:1"
replicas = ["redis://127.0.0.1:2"]
"""


def test_replag_demo_runs_as_a_non_root_user(image: str) -> None:
    config = json.loads(docker("image", "inspect", image))[0]["Config"]
    assert config["User"] == "10001:10001" and config["Entrypoint"] == ["replag"]
    assert docker("run", "--rm", "--entrypoint", "id", image, "-u") == "10001"
    out = docker("run", "--rm", image, "demo", timeout=300)
    assert "eu-west-1" in out and "lab stopped" in out  # the embedded servers ran


def test_no_compiler_and_at_most_150_mb_over_its_base(image: str) -> None:
    found = docker(
        "run", "--rm", "--entrypoint", "sh", image, "-c",
        "for c in gcc cc c++ clang tcc ld pip pip3; do command -v $c; done; true",
    )  # fmt: skip
    assert found == ""
    # The C extension came with the wheel built on the host, not from a compiler here.
    assert "_scanindex" in docker(
        "run", "--rm", "--entrypoint", "python3", image, "-c", "import replag._scanindex as m;"
        "print(m.__name__)",
    )  # fmt: skip
    size = int(docker("image", "inspect", "-f", "{{.Size}}", image))
    base = int(docker("image", "inspect", "-f", "{{.Size}}", BASE))
    print(f"image {image}: {size / 1e6:.1f} MB, {(size - base) / 1e6:.1f} MB over {BASE}")
    assert size - base <= 150e6


def test_serve_becomes_healthy_and_logs_json(image: str, tmp_path: Path) -> None:
    (tmp_path / "replag.toml").write_text(CONFIG)
    tmp_path.chmod(0o755)
    (tmp_path / "replag.toml").chmod(0o644)
    name = PREFIX + "health"
    # The image's own HEALTHCHECK command, run every second instead of every 30.
    docker("run", "-d", "--name", name, "--health-interval", "1s", "--read-only",
           "--tmpfs", "/var/lib/replag:uid=10001,gid=10001",
           "-v", f"{tmp_path}:/etc/replag:ro", image)  # fmt: skip
    try:
        wait_healthy(name)
        lines = [line for line in logs(name, tail=200).splitlines() if line.strip()]
    finally:
        docker("rm", "-f", name, check=False)
    entries = [json.loads(line) for line in lines]  # every line one JSON object
    assert any("Uvicorn running on http://0.0.0.0:8700" in e["message"] for e in entries)
    assert any(e.get("unit") == "probe:us-east" for e in entries), lines
