"""Two checks or repairs of one group never run at once, whatever runs them (the CLI, a
service's job) and whatever the store (SQLite or PostgreSQL): the second is refused
naming the holder, and the group is free again once the first ends."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import tomli_w

from replag.config import load_config
from replag.errors import JobConflict
from replag.repair.exclusive import LEASE_S, lease_name
from replag.service import ReplagService
from replag.store import Store, leases
from tests.helpers.cli import run_replag
from tests.helpers.redis_servers import RedisFactory


def _config(path: Path, store: str, urls: list[str]) -> Path:
    data = {
        "settings": {"store": store, "repair_settle": "10ms"},
        "regions": [{"name": f"r{i}", "replicas": [{"name": f"n{i}", "url": u}]}
                    for i, u in enumerate(urls)],
        "groups": [{"name": "g", "members": [f"n{i}" for i in range(len(urls))]}],
    }  # fmt: skip
    path.write_text(tomli_w.dumps(data))
    return path


def _repair_run(config: Path) -> subprocess.CompletedProcess[str]:
    return run_replag("repair", "run", "--config", str(config), "-g", "g", timeout=120)


async def test_a_second_run_of_a_group_is_refused_naming_the_holder(
    redis_factory: RedisFactory, store_location: str, tmp_path: Path
) -> None:
    a, b = redis_factory("a"), redis_factory("b")
    a.client().set("k", "1")
    config = _config(tmp_path / "replag.toml", store_location, [a.url, b.url])
    with Store(store_location) as store:
        # Another instance (its holder name) runs a repair of g.
        other = "other-host:4242:abcdef"
        # Held for long: a loaded host may take more than LEASE_S to start the CLI below.
        held = leases.acquire(store, lease_name("g"), holder=other, ttl_s=30 * LEASE_S)
        assert held is not None
        try:
            cli = _repair_run(config)
            assert cli.returncode == 2, cli.stderr
            assert "already running" in cli.stderr and other in cli.stderr
            assert len(cli.stderr.strip().splitlines()) == 1  # one line, no traceback
            assert not b.client().exists("k")  # nothing was repaired
            service = ReplagService(load_config(config), store=store)
            with pytest.raises(JobConflict, match=other):  # the API answers 409
                service.start_job("repair", "g")
            await service.stop()
        finally:
            leases.release(store, held)
    cli = _repair_run(config)  # free again: it runs
    assert cli.returncode == 0, cli.stderr
    assert b.client().get("k") == b"1"
