"""The schedules run on loops of their own: a stuck probe round or check never stalls the API."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx

from replag.api.app import create_app
from replag.config import Config
from replag.probes.report import ProbeReport
from replag.service import ReplagService
from replag.store import Store
from tests.helpers.configs import TOKEN, make_config


async def test_api_answers_while_a_probe_round_blocks_its_loop(tmp_path: Path) -> None:
    """The probe below blocks its event loop outright (a stand-in for CPU-bound work); the
    API, on its own loop, answers meanwhile, and a check started through it runs too."""
    entered, release = threading.Event(), threading.Event()
    threads: dict[str, str] = {}

    async def stuck_probe(config: Config, *, source: str, **_: Any) -> ProbeReport:
        threads["probe"] = threading.current_thread().name
        entered.set()
        release.wait(60)  # blocks this loop, as a long synchronous stretch would
        raise asyncio.CancelledError

    settings = {"store": str(tmp_path / "s.sqlite"), "api_token": TOKEN, "probe_interval": "1h"}
    config = make_config(tmp_path, settings=settings)
    service = ReplagService(config, store=Store(tmp_path / "s.sqlite"), probe=stuck_probe)
    app = create_app(config, service=service)
    try:
        async with app.router.lifespan_context(app):
            assert await asyncio.to_thread(entered.wait, 60)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://r") as client:
                health = await client.get("/api/v1/health")
                assert health.status_code == 200
                # The group's scheduled check (at start, on its own loop) may still hold the
                # group: 409 until it has failed on the closed ports, then ours is taken.
                for _ in range(300):
                    started = await client.post(
                        "/api/v1/repairs", json={"action": "check", "group": "main"},
                        headers={"Authorization": f"Bearer {TOKEN}"},
                    )  # fmt: skip
                    if started.status_code != 409:
                        break
                    await asyncio.sleep(0.2)
                assert started.status_code == 202, started.text
                job = await service.wait_job(started.json()["job_id"])
                # The members are closed ports: it failed, but it ran, beside the stuck probe.
                assert job.state == "failed" and not release.is_set()
            release.set()
    finally:
        release.set()
    assert threads["probe"] == "replag-schedules"
    assert threading.current_thread().name not in threads.values()
