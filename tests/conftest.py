"""Fixtures that start real redis-server processes and labs on free ports and stop them.

Only fixtures live here; what tests import (the factories' types, helpers) is in
`tests/helpers/`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.lab.server import RedisServer, free_port
from tests.helpers.lab import LabFactory
from tests.helpers.redis_servers import RedisFactory


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[RedisFactory]:
    """`redis_factory(name="a", password=None, extra_args=())` → a started RedisServer."""
    servers: list[RedisServer] = []

    def start(
        name: str = "r", *, password: str | None = None, extra_args: tuple[str, ...] = ()
    ) -> RedisServer:
        srv = RedisServer(
            name=f"{name}{len(servers)}",
            port=free_port(),
            workdir=tmp_path / "redis",
            password=password,
            extra_args=extra_args,
        )
        servers.append(srv)
        return srv.start()

    yield start
    for srv in servers:
        srv.stop()


@pytest.fixture
def lab_factory(tmp_path: Path) -> Iterator[LabFactory]:
    """`lab_factory(regions=(…), delays_ms={…}, …)` → lab state; the lab is torn down after."""
    dirs: list[Path] = []

    def start(name: str = "lab", **spec: Any) -> dict[str, Any]:
        lab_dir = tmp_path / name
        dirs.append(lab_dir)
        spec.setdefault("regions", ("us-east", "us-west", "eu-west"))
        spec.setdefault("delays_ms", {})
        state = lab_up(lab_dir, LabSpec(**spec))
        state["dir"] = lab_dir
        return state

    yield start
    for lab_dir in dirs:
        if (lab_dir / "lab.json").exists():
            lab_down(lab_dir)
