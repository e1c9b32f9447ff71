"""The service over each backend: probing, the lag index, alerts, a check with its run,
and health read the same from SQLite and from PostgreSQL. And a PostgreSQL restarted
under a store: writes meanwhile wait in memory, nothing written is lost."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w

from replag.config import load_config
from replag.lab.postgres import LocalPostgres
from replag.repair import get_run
from replag.service import ReplagService
from replag.store import LagWindow, Store
from tests.helpers.lab import LabFactory
from tests.helpers.postgres import NO_POSTGRES, postgres_available


async def test_the_service_runs_the_same_on_both_backends(
    lab_factory: LabFactory, tmp_path: Path, store_location: str
) -> None:
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={})
    data = tomllib.loads((Path(lab["dir"]) / "topology.toml").read_text())
    data.setdefault("settings", {}).update(count=10, rate=0, timeout="2s", store=store_location)
    data["alerts"] = {"rules": [{"name": "any-lag", "kind": "lag_p99", "threshold": "0ms"}]}
    path = tmp_path / "replag.toml"
    path.write_text(tomli_w.dumps(data))
    service = ReplagService(load_config(path))
    try:
        await service.probe_round()
        await service.probe_round()
        assert ("us-east", "eu-west") in service.index.pairs()
        summary = service.index.summary("us-east", "eu-west")
        assert summary.seen == 2 * 10 and summary.lag_ms["p50"] is not None
        assert {a["status"] for a in service.alert_book.active()} == {"firing"}
        job = service.start_job("check", "lab")
        done = await service.wait_job(job.id)
        assert done.state == "done" and done.divergent == 0, done.error
        run = get_run(service.store, done.run_id or "")
        assert run is not None and run["status"] == "done" and run["owner"]
        health = service.health()
        assert health["store"]["state"] == "ok" and health["probes"]["us-east"]["error"] is None
    finally:
        await service.stop()


@pytest.mark.skipif(not postgres_available(), reason=NO_POSTGRES)
def test_writes_wait_while_postgresql_restarts_and_none_is_lost(tmp_path: Path) -> None:
    server = LocalPostgres().start()
    try:
        store = Store(server.create_database("restarts"))

        def window(i: int) -> LagWindow:
            w = LagWindow(run_id=f"r{i}", source="a", target="b", replica="b-1",
                          start_ns=i, end_ns=i + 1, sent=1, seen=1)  # fmt: skip
            w.lag.record_us(1000 + i)
            return w

        store.append_windows([window(0)])
        server.stop()
        store.append_windows([window(1)])  # PostgreSQL away: kept in memory
        store.append_windows([window(2)])
        assert store.health.state == "unwritable" and len(store.unsaved_windows) == 2
        server.start()
        assert store.flush()  # what the next write would do, without its retry interval
        store.append_windows([window(3)])
        assert store.health.state == "ok" and not store.unsaved_windows
        assert [w.run_id for w in store.windows()] == ["r0", "r1", "r2", "r3"]
        store.close()
    finally:
        server.destroy()
