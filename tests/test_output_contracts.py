"""Every `--json` output carries schema_version and validates against its published schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from replag.lab.server import RedisServer
from replag.schemas import SCHEMA_VERSION, SCHEMAS, schema
from tests.helpers.redis_servers import primary_and_replicas


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisServer]]:
    with primary_and_replicas(tmp_path_factory.mktemp("contracts")) as started:
        yield started


@pytest.fixture(scope="module")
def config(servers: list[RedisServer], tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("contracts-config")
    path = where / "replag.toml"
    replag(["topology", "discover", "--redis", servers[0].url, "--out", str(path)], where)
    with servers[0].client() as client:
        client.mset({f"user:{n}": n for n in range(50)})
    return path


def replag(args: list[str], where: Path, expect: int = 0) -> str:
    env = {**os.environ, "REPLAG_STORE": str(where / "store.sqlite")}
    done = subprocess.run(
        [sys.executable, "-m", "replag", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == expect, done.stdout + done.stderr
    return done.stdout


def valid(name: str, text: str) -> dict[str, Any]:
    document = json.loads(text)
    jsonschema.validate(document, schema(name), format_checker=jsonschema.FormatChecker())
    assert document["schema_version"] == SCHEMA_VERSION
    return document


def test_every_schema_is_a_valid_json_schema() -> None:
    for name in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema(name))


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("probe", ["probe", "--count", "20", "--json"]),
        ("check", ["repair", "check", "--json"]),
        ("repair", ["repair", "run", "--dry-run", "--json"]),
        ("failover-check", ["failover-check"]),
        ("runs", ["repair", "runs", "--json"]),
    ],
)
def test_real_outputs_validate(name: str, args: list[str], config: Path) -> None:
    if name == "runs":  # at least one run to list, whichever worker runs this
        replag(["repair", "check", "-c", str(config)], config.parent)
    document = valid(name, replag([*args, "-c", str(config)], config.parent))
    if name == "runs":
        assert document["runs"]


def test_schema_command_prints_each_schema(tmp_path: Path) -> None:
    for name in SCHEMAS:
        assert json.loads(replag(["schema", name], tmp_path)) == schema(name)
