"""A store that fails loudly: full (writes kept in memory while probing and alerting go on,
said in health and metrics, written once it takes writes again) or damaged (refused at
start in one line)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from aiohttp import web
from prometheus_client import generate_latest

from replag.config import load_config
from replag.service import ReplagService
from replag.store import Store
from tests.helpers.cli import run_replag
from tests.helpers.lab import LabFactory
from tests.helpers.waiting import until

FAST = {"count": 20, "rate": 0, "timeout": "2s", "probe_interval": "300ms"}


def _config(lab: dict[str, Any], tmp_path: Path, alerts: dict[str, Any] | None = None) -> Path:
    data = tomllib.loads((Path(lab["dir"]) / "topology.toml").read_text())
    data.setdefault("settings", {}).update(FAST, store=str(tmp_path / "svc.sqlite"))
    if alerts:
        data["alerts"] = alerts
    path = tmp_path / "replag.toml"
    path.write_text(tomli_w.dumps(data))
    return path


async def test_a_full_store_keeps_probing_and_alerting_says_why_and_recovers(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={})
    received: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        received.extend((await request.json())["alerts"])
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    alerts = {
        "rules": [{"name": "any-lag", "kind": "lag_p99", "threshold": "0ms", "over": "1m"}],
        "sinks": [{"name": "hook", "kind": "webhook", "url": f"http://127.0.0.1:{runner.addresses[0][1]}/"}],
    }  # fmt: skip
    service = ReplagService(load_config(_config(lab, tmp_path, alerts)))
    store = service.store
    # The file may not grow: every write that needs a new page fails as on a full disk.
    pages = store.execute("PRAGMA page_count")[0][0]
    store.execute(f"PRAGMA max_page_count = {pages}")
    await service.start()
    try:
        await until(lambda: store.health.state == "unwritable", timeout_s=60)
        runs = service.counters["probe runs"]
        await until(lambda: service.counters["probe runs"] >= runs + 3, timeout_s=60)
        # Alerting went on from what was measured meanwhile (the index serves the windows
        # held in memory), and the alert fired once, not once per round.
        await until(lambda: any(a["status"] == "firing" for a in received), timeout_s=60)
        assert store.unsaved_windows and service.index.pairs()
        health = service.health()
        assert health["status"] in ("degraded", "failing")
        problem = next(p for p in health["problems"] if p["kind"] == "store")
        assert (
            "store full/unwritable" in problem["message"] and "disk is full" in problem["message"]
        )
        assert health["store"]["state"] == "unwritable" and health["store"]["deferred"] > 0
        metrics = generate_latest(service.metrics.registry).decode()
        assert "replag_store_writable 0.0" in metrics
        assert "replag_store_write_errors_total 0.0" not in metrics
        firing = sum(a["status"] == "firing" for a in received)
        # Room again: what waited is written, and the service says so.
        store.execute("PRAGMA max_page_count = 1073741823")
        await until(lambda: store.health.state == "ok", timeout_s=60)
        assert store.health.recovered == 1 and store.health.dropped == 0
        assert not store.unsaved_windows
        stored = store.execute("SELECT COUNT(*) AS n FROM lag_windows")[0].n
        assert stored >= 3 * 2  # a window per target per round, none lost
        states = {r.fingerprint: r.status for r in store.execute("SELECT * FROM alert_state")}
        assert len(states) == len({a["fingerprint"] for a in received})
        assert set(states.values()) == {"firing"}
        assert "store" not in [p["kind"] for p in service.health()["problems"]]
        assert "replag_store_writable 1.0" in generate_latest(service.metrics.registry).decode()
        runs = service.counters["probe runs"]
        await until(lambda: service.counters["probe runs"] >= runs + 2, timeout_s=60)
        assert sum(a["status"] == "firing" for a in received) == firing  # no repeat
    finally:
        await service.stop()
        await runner.cleanup()


def _damage_lag_windows(path: Path) -> None:
    """Overwrite the root page of lag_windows with garbage (the store is closed)."""
    with sqlite3.connect(path) as db:
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'lag_windows'"
        ).fetchone()[0]
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    with path.open("r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xa5" * page_size)


def test_a_damaged_store_is_refused_at_start_in_one_line(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={})
    config = _config(lab, tmp_path)
    Store(tmp_path / "svc.sqlite").close()
    _damage_lag_windows(tmp_path / "svc.sqlite")
    for args in (["serve", "-c", str(config), "--port", "0"], ["probe", "-c", str(config)]):
        done = run_replag(*args, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, (args, done.stderr)
        assert len(lines) == 1 and "Traceback" not in done.stderr, (args, done.stderr)
        assert str(tmp_path / "svc.sqlite") in lines[0] and "damaged" in lines[0]


async def test_a_failed_index_warm_up_is_said_not_hidden(tmp_path: Path) -> None:
    from replag.config import config_from_dict

    config = config_from_dict(
        {
            "settings": {"store": str(tmp_path / "s.sqlite")},
            "regions": [{"name": "a", "replicas": ["redis://127.0.0.1:1"]}],
        },
        where="test",
        environ={},
    )
    store = Store(tmp_path / "s.sqlite")
    store.execute("DROP TABLE lag_windows")  # the index's reads fail from now on
    service = ReplagService(config, store=store)
    await service.start()
    try:
        await until(lambda: service.index.load_error is not None, timeout_s=30)
        health = service.health()
        assert any("index could not read the store" in p["message"] for p in health["problems"])
    finally:
        await service.stop()
        store.close()
    await asyncio.sleep(0)


def test_the_probe_cli_on_a_full_disk_says_its_results_were_not_stored(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    disk = _small_disk(tmp_path / "disk", "4m")
    with contextlib.ExitStack() as stack:
        stack.callback(subprocess.run, ["umount", str(disk)], check=False)
        lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={})
        config = _config(lab, tmp_path)
        data = tomllib.loads(config.read_text())
        data["settings"]["store"] = str(disk / "s.sqlite")
        config.write_text(tomli_w.dumps(data))
        # Another process has the store open (a service beside the cron probe): its WAL
        # and shared-memory files exist, so only writes need room.
        held = stack.enter_context(Store(disk / "s.sqlite"))
        filler = disk / "filler"
        with filler.open("wb") as f, contextlib.suppress(OSError):
            while True:  # the disk is full
                f.write(b"\0" * 65536)
                f.flush()
        full = run_replag("probe", "-c", str(config), timeout=120)
        assert full.returncode == 2, full.stderr
        assert "us-east" in full.stdout  # measured and shown all the same
        # The store's own log line when it turned unwritable, then the command's error.
        lines = full.stderr.strip().splitlines()
        assert len(lines) <= 2 and "Traceback" not in full.stderr, full.stderr
        line = lines[-1]
        assert line.startswith("replag: error: ") and "not stored" in line, line
        assert "database or disk is full" in line, line
        filler.unlink()
        held.close()
        again = run_replag("probe", "-c", str(config), timeout=120)
        assert again.returncode == 0, again.stderr
        with Store(disk / "s.sqlite") as store:
            assert store.execute("SELECT COUNT(*) AS n FROM lag_windows")[0].n > 0


async def test_a_service_on_a_full_disk_keeps_its_leases_and_probing(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    """A real full file system (not a page limit): lease renewals cannot be written either,
    and nobody can take a lease over (that is a write too), so the units carry on."""
    disk = _small_disk(tmp_path / "disk", "8m")
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(subprocess.run, ["umount", str(disk)], check=False)
        lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={})
        config = _config(lab, tmp_path)
        data = tomllib.loads(config.read_text())
        data["settings"].update(store=str(disk / "s.sqlite"), lease_time="3s")
        config.write_text(tomli_w.dumps(data))
        service = ReplagService(load_config(config))
        await service.start()
        stack.push_async_callback(service.stop)
        await until(lambda: service.counters["probe runs"] >= 2, timeout_s=60)
        filler = disk / "filler"
        with filler.open("wb") as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        await until(lambda: service.store.health.state == "unwritable", timeout_s=60)
        runs = service.counters["probe runs"]
        # Well past the lease time: still probing.
        await until(lambda: service.counters["probe runs"] >= runs + 15, timeout_s=120)
        filler.unlink()
        await until(lambda: service.store.health.state == "ok", timeout_s=60)
        runs = service.counters["probe runs"]
        await until(lambda: service.counters["probe runs"] >= runs + 3, timeout_s=60)


def _small_disk(path: Path, size: str) -> Path:
    """A tmpfs of `size` mounted at `path` (to fill up), or skip: mounting needs root."""
    path.mkdir()
    mounted = os.geteuid() == 0 and not (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            check=False,
        ).returncode
    )
    if not mounted:
        pytest.skip("cannot mount a small tmpfs (needs root) to fill")
    return path
