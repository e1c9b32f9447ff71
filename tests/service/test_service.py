"""The service against a real lab: `replag serve` as a subprocess, and in-process scheduling."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import signal
import socket
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w
from aiohttp import web

from replag.alerts.health import group_health, record_check
from replag.alerts.rules import evaluate_rules
from replag.config import config_from_dict, load_config
from replag.lab.server import free_port
from replag.lagindex import LagIndex
from replag.monitoring.dynomite_figures import parse_info
from replag.monitoring.dynomite_stats import recent_stats, record_stats
from replag.repair import check, get_run
from replag.service import ReplagService
from replag.store import Store
from tests.helpers.cli import replag_argv, replag_env, run_replag
from tests.helpers.dynomite_admin import fixture_bytes
from tests.helpers.lab import LabFactory
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.waiting import until

FAST = {"count": 20, "rate": 0, "timeout": "2s", "probe_interval": "300ms"}


def service_config(
    lab: dict[str, Any], tmp_path: Path, alerts: dict[str, Any] | None = None
) -> Path:
    """The lab's topology file with fast service settings (and an [alerts] table) added."""
    data = tomllib.loads((Path(lab["dir"]) / "topology.toml").read_text())
    data.setdefault("settings", {}).update(FAST, store=str(tmp_path / "svc.sqlite"))
    if alerts:
        data["alerts"] = alerts
    path = tmp_path / "replag.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def test_serve_subprocess_shows_probe_data_and_stops_on_sigterm(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={"eu-west": 20})
    config = service_config(lab, tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        replag_argv("serve", "--config", str(config), "--port", str(port)),
        stderr=subprocess.PIPE, text=True, env=replag_env(),
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def measured(r: httpx.Response) -> bool:
            return any(p["target"] == "eu-west" and p["seen"] for p in r.json()["pairs"])

        lag = _poll(base, "/api/v1/lag?since=5m", measured, proc)
        pair = next(p for p in lag.json()["pairs"] if p["target"] == "eu-west")
        assert pair["lag_ms"]["p50"] >= 15  # the relay holds bytes 20 ms one way
        labels = 'rack="",replica="eu-west-1",source="us-east",target="eu-west"'
        series = f"replag_lag_seconds_count{{{labels}}}"
        metrics = _poll(
            base, "/metrics", lambda r: series in r.text and f"{series} 0.0" not in r.text, proc
        ).text
        assert 'replag_last_success_timestamp_seconds{name="us-east",task="probe"}' in metrics
        health = httpx.get(base + "/api/v1/health").json()
        assert health["probes"]["us-east"]["last_success_ns"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    # A clean stop on SIGTERM exits 0, as a systemd unit expects (uvicorn alone re-raises it).
    assert proc.returncode == 0, stderr
    assert "Application shutdown complete" in stderr
    assert f"Uvicorn running on http://127.0.0.1:{port}" in stderr  # loopback unless told
    assert "service stopped: " in stderr and "probe runs" in stderr


def _poll(base: str, path: str, ok: Any, proc: subprocess.Popen[str]) -> httpx.Response:
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            response = httpx.get(base + path, timeout=5)
            if response.status_code == 200 and ok(response):
                return response
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{path} never showed probe data")


async def test_a_slow_sink_does_not_block_probing(lab_factory: LabFactory, tmp_path: Path) -> None:
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={})
    held = asyncio.Event()
    release = asyncio.Event()

    async def slow_hook(request: web.Request) -> web.Response:
        held.set()
        await release.wait()
        return web.Response(text="finally")

    app = web.Application()
    app.router.add_post("/", slow_hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    alerts = {
        "rules": [{"name": "any-lag", "kind": "lag_p99", "threshold": "0ms", "over": "1m"}],
        "sinks": [{"name": "slow", "kind": "webhook", "url": url, "timeout": "60s"}],
    }
    service = ReplagService(load_config(service_config(lab, tmp_path, alerts)))
    await service.start()
    try:
        await asyncio.wait_for(held.wait(), 30)  # the alert fired; its hook is stuck
        runs_then = service.counters["probe runs"]
        await until(lambda: service.counters["probe runs"] >= runs_then + 3)
        assert [s["last_status"] for s in service.sender.statuses()] == ["never"]
        release.set()
        await until(lambda: service.sender.statuses()[0]["last_status"] == "ok")
        assert service.alert_book.firing_count() >= 1
    finally:
        release.set()
        await service.stop()
        await runner.cleanup()


@pytest.mark.parametrize("host", ["127.0.0.1"])
def test_serve_binds_loopback_by_default(host: str) -> None:
    from replag.commands.serve import command

    defaults = {p.name: p.default for p in command.params}
    assert defaults["host"] == host and defaults["port"] == 8700


def test_serve_refuses_a_taken_port_before_probing(tmp_path: Path) -> None:
    store = tmp_path / "svc.sqlite"
    config = tmp_path / "replag.toml"
    config.write_text(tomli_w.dumps({
        "settings": {"store": str(store), "probe_interval": "1s"},
        "regions": [{"name": "us-east", "write": f"redis://127.0.0.1:{free_port()}"}],
    }))  # fmt: skip
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = run_replag("serve", "--config", str(config), "--port", str(port), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"replag: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
    assert not store.exists()  # nothing was probed, nothing was written


def _group_config(tmp_path: Path, groups: dict[str, list[str]]) -> Any:
    members = [url for urls in groups.values() for url in urls]
    return config_from_dict({
        "settings": {"store": str(tmp_path / "svc.sqlite"), "timeout": "2s"},
        "regions": [{"name": "us-east", "replicas": sorted(set(members))}],
        "groups": [{"name": name, "members": urls} for name, urls in groups.items()],
        "alerts": {"rules": [{"name": "diverged", "kind": "divergent_keys"}]},
    }, where="replag.toml", environ={})  # fmt: skip


async def test_a_store_error_fails_its_job_and_the_round_goes_on(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    a, b, c, d = (redis_factory(name) for name in "abcd")
    config = _group_config(tmp_path, {"first": [a.url, b.url], "second": [c.url, d.url]})
    store = Store(tmp_path / "svc.sqlite")
    # Not an endpoint's error: the store refuses to log the first group's run.
    store.execute("""CREATE TRIGGER refuse_first BEFORE INSERT ON repair_runs
                     WHEN NEW.params_json LIKE '%"first"%'
                     BEGIN SELECT RAISE(ABORT, 'disk trouble'); END""")  # fmt: skip
    service = ReplagService(config, store=store)
    try:
        await service.check_round()
        jobs = {j.group: j for j in service.jobs.values()}
        assert jobs["first"].state == "failed" and jobs["first"].finished_ns
        assert jobs["first"].error == f"{tmp_path / 'svc.sqlite'}: disk trouble"
        assert jobs["second"].state == "done" and jobs["second"].divergent == 0
        health = group_health(store)
        assert health["first"].error == jobs["first"].error
        assert health["second"].divergent == 0 and health["second"].error is None
        # The round went on to the alerts, and the next job of the group can start.
        assert service.alert_book.history() == []
        await service.wait_job(service.start_job("check", "second").id)
    finally:
        await service.stop()
        store.close()


async def test_prune_round_drops_alert_history_older_than_retention(tmp_path: Path) -> None:
    config = _group_config(tmp_path, {"main": ["redis://127.0.0.1:1", "redis://127.0.0.1:2"]})
    store = Store(tmp_path / "svc.sqlite")
    service = ReplagService(config, store=store)
    try:
        now = time.time_ns()
        old = now - int(config.settings.retention * 1e9) - 3600 * 10**9
        info = json.loads(fixture_bytes("3rack_node1_22222_info.json"))
        record_stats(store, [parse_info(info, node="n1", sampled_ns=t) for t in (old, now)])
        for at, divergent in ((old, 3), (old + 1, 0), (now, 5)):
            record_check(store, group="main", divergent=divergent, run_id=None, error=None)
            conditions = evaluate_rules(config, LagIndex(store), now_ns=at)
            service.alert_book.apply(conditions, now_ns=at, repeat_interval_s=3600)
        history = [h["status"] for h in service.alert_book.history()]
        assert history == ["firing", "pending", "resolved", "firing", "pending"]
        await service.prune_round()
        assert [h["status"] for h in service.alert_book.history()] == ["firing", "pending"]
        assert [s.sampled_ns for s in recent_stats(store, limit=10)] == [now]  # its own table
        assert service.alert_book.firing_count() == 1
    finally:
        await service.stop()
        store.close()


async def test_serve_takes_its_long_lived_objects_out_of_the_collectors_passes(
    tmp_path: Path,
) -> None:
    """A full collection walks every tracked object holding the GIL (50–120 ms in `serve`
    on a busy host, every API request waiting): once the index is warm, what is left
    lives as long as the process and is frozen, so later passes walk only newer objects."""
    config = _group_config(tmp_path, {"main": ["redis://127.0.0.1:1", "redis://127.0.0.1:2"]})
    store = Store(tmp_path / "svc.sqlite")
    before = gc.get_freeze_count()
    tracked = len(gc.get_objects())
    library = ReplagService(config, store=store)  # a library user's heap is theirs
    service = ReplagService(config, store=store, freeze_heap=True)
    try:
        await library.start()
        await until(lambda: _task_done(library, "index-warmup"), "the library's warm-up")
        await library.stop()
        assert gc.get_freeze_count() == before
        await service.start()
        await until(lambda: gc.get_freeze_count() > before, "the heap frozen after warm-up")
        assert gc.get_freeze_count() >= tracked // 2
        assert len(gc.get_objects()) < tracked // 4  # what a full pass still walks
    finally:
        await service.stop()
        store.close()
        gc.unfreeze()


def _task_done(service: ReplagService, name: str) -> bool:
    return any(t.get_name() == name and t.done() for t in service._tasks)


async def test_the_services_checks_read_at_service_scan_rate(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    """A check the service runs shares the host and the servers with the API, the probes
    and the replicas' clients: it is throttled (the CLI's, with scan_rate 0, is not), and
    its run says at what rate."""
    a, b = redis_factory("a"), redis_factory("b")
    for server in (a, b):
        server.client().mset({f"k{i}": "v" for i in range(600)})
    config = _group_config(tmp_path, {"main": [a.url, b.url]})
    config = dataclasses.replace(
        config, settings=dataclasses.replace(config.settings, service_scan_rate=1000.0)
    )
    store = Store(tmp_path / "svc.sqlite")
    service = ReplagService(config, store=store)
    try:
        job = await service.wait_job(service.start_job("check", "main").id)
        assert job.state == "done" and job.divergent == 0
        run = get_run(store, job.run_id or "")
        assert run is not None and run["report"]["scan_rate"] == 1000.0
        cli = await check(config, group="main", store=store)  # as `replag repair check`
        assert cli.to_dict()["scan_rate"] is None
    finally:
        await service.stop()
        store.close()


async def test_a_job_can_leave_expiries_uncompared(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    """POST /repairs {"ttls": "ignore"} reaches the check: a TTL alone is then not a divergence."""
    a, b = redis_factory("a"), redis_factory("b")
    for server in (a, b):
        server.client().mset({f"k{i}": "v" for i in range(50)})
    b.client().pexpire("k7", 600_000)
    config = _group_config(tmp_path, {"main": [a.url, b.url]})
    store = Store(tmp_path / "svc.sqlite")
    service = ReplagService(config, store=store)
    try:
        ignored = await service.wait_job(service.start_job("check", "main", ttls="ignore").id)
        compared = await service.wait_job(service.start_job("check", "main", ttls=None).id)
        assert (ignored.state, ignored.divergent, compared.divergent) == ("done", 0, 1)
        run = get_run(store, ignored.run_id or "")
        assert run is not None and run["report"]["ttls"] == "ignore"
    finally:
        await service.stop()
        store.close()
