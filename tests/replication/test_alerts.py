"""Every replication alert rule through the real alert path: a service sampling a real lab,
its alert book, and a real webhook receiver. Firing while a region is cut off and another
lags, no data while the primary cannot be read, pending under a long `for`, resolved once
the links heal."""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from aiohttp import web

from replag.config import config_from_dict
from replag.lab.cluster import lab_fault
from replag.service import ReplagService
from replag.store import Store
from tests.helpers.lab import LabFactory
from tests.helpers.waiting import until

NODATA = {"no_data": "nodata"}
RULES = [
    {"name": "behind", "kind": "replication_bytes_behind", "threshold": 1000, **NODATA},
    {"name": "behind-1h", "kind": "replication_bytes_behind", "threshold": 1000, "for": "1h"},
    # 1 MiB backlog: under 99.9 % left is about 1 KiB behind.
    {"name": "headroom", "kind": "replication_headroom", "threshold": 0.999, **NODATA},
    {"name": "link", "kind": "replication_link_down", "threshold": "0s", **NODATA},
    {"name": "full-resync", "kind": "replication_full_resync", "over": "10m", **NODATA},
    {"name": "rpo", "kind": "failover_rpo_bytes", "threshold": 1000, **NODATA},
    {"name": "rpo-time", "kind": "failover_rpo_time", "threshold": "100ms", **NODATA},
]
# b's replication link holds bytes this long: b-1 stays up but behind while writes go on.
SLOW_MS = 5000


@dataclass
class Receiver:
    """A webhook receiver keeping every Alertmanager-style alert it was sent, in order."""

    alerts: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.alerts += json.loads(await request.read())["alerts"]
        return web.Response(text="ok")

    def states(self, rule: str, subject: str) -> list[str]:
        """The states sent for one alert (rule + replica or primary), in order."""
        return [
            a["annotations"]["state"]
            for a in self.alerts
            if a["labels"]["alertname"] == rule and subject_of(a["labels"]) == subject
        ]


def subject_of(labels: dict[str, str]) -> str:
    return labels.get("replica") or labels["primary"]


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/", rec.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield rec, f"http://127.0.0.1:{runner.addresses[0][1]}/"
    await runner.cleanup()


def states(svc: ReplagService) -> dict[tuple[str, str], str]:
    """(rule, replica or primary) → status of every alert not resolved."""
    return {(a["rule"], subject_of(a["labels"])): a["status"] for a in svc.alert_book.active()}


def write(port: int, count: int, prefix: str) -> None:
    with redis.Redis(port=port) as client:
        pipe = client.pipeline(transaction=False)
        for i in range(count):
            pipe.set(f"{prefix}{i}", b"x" * 100)
        pipe.execute()


async def rounds_until(
    svc: ReplagService,
    done: Callable[[dict[tuple[str, str], str]], bool],
    what: str,
    *,
    before_each: Callable[[int], None] | None = None,
    timeout_s: float = 120,
) -> dict[tuple[str, str], str]:
    """Replication rounds (each evaluating the rules) until `done(states)`; fail naming
    `what` and the states last seen. Waits on the alert states, never on a sleep."""
    deadline = time.monotonic() + timeout_s
    n = 0
    while True:
        if before_each is not None:
            before_each(n)
        await svc.replication_round()
        now = states(svc)
        if done(now):
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout_s:g}s: {what}; states {now}")
        n += 1


async def test_every_replication_rule_fires_goes_to_no_data_and_resolves(
    server_kind: str,
    lab_factory: LabFactory,
    tmp_path: Path,
    receiver: tuple[Receiver, str],
) -> None:
    hook, url = receiver
    # The backlog's size fixed (Valkey's default is 10 MiB, Redis's 1 MiB): see RULES.
    lab = lab_factory(regions=("a", "b"), delays_ms={"b": 1}, backlog_bytes=1 << 20)
    lab_dir = Path(lab["dir"])
    primary_port = next(p["port"] for p in lab["processes"] if p["role"] == "primary")
    data = tomllib.loads((lab_dir / "topology.toml").read_text())
    # The test drives the rounds itself; the service's own schedules never start.
    data["settings"].update(store=str(tmp_path / "svc.sqlite"), connect_timeout="500ms")
    data["alerts"] = {"rules": RULES, "sinks": [{"name": "ops", "kind": "webhook", "url": url}]}
    svc = ReplagService(
        config_from_dict(data, where="test", environ={}), store=Store(tmp_path / "svc.sqlite")
    )
    try:
        await run_scenario(svc, hook, lab_dir, primary_port)
    finally:
        await svc.stop()


async def run_scenario(svc: ReplagService, hook: Receiver, lab_dir: Path, port: int) -> None:
    await svc.replication_round()
    assert states(svc) == {}
    (before,) = svc.latest_replication()

    # a-1 cut off, b-1 up but 5 s behind while writes go on.
    lab_fault(lab_dir, "a", "partition")
    lab_fault(lab_dir, "b", "delay", delay_ms=SLOW_MS)
    firing = {
        ("behind", "a-1"),
        ("behind", "b-1"),
        ("headroom", "a-1"),
        ("link", "a-1"),
        ("rpo", "a-primary"),
        ("rpo-time", "a-primary"),
    }
    now = await rounds_until(
        svc,
        lambda s: all(s.get(k) == "firing" for k in firing),
        "every rule firing",
        before_each=lambda n: write(port, 10, f"w{n}-"),
    )
    assert now[("behind-1h", "a-1")] == "pending"  # `for` 1h: never fires in this test
    assert ("link", "b-1") not in now and ("full-resync", "a-primary") not in now
    (primary,) = svc.latest_replication()
    rpo = svc.failover_assessment(primary, now_ns=time.time_ns())
    assert rpo.safest is not None and rpo.safest.replica == "b-1"  # a-1's link is down
    await until(lambda: all(hook.states(*k)[:1] == ["firing"] for k in firing), "firing sent")
    assert hook.states("behind-1h", "a-1") == []  # pending is never sent

    # The primary cannot be read (paused longer than the sampler waits): no data, and the
    # rules saying `nodata` move there, while the pending one (keep_firing) waits.
    with redis.Redis(port=port) as client:
        client.execute_command("CLIENT", "PAUSE", "10000", "ALL")
    nodata = {*firing, ("full-resync", "a-primary")}
    now = await rounds_until(
        svc, lambda s: all(s.get(k) == "nodata" for k in nodata), "every rule without data"
    )
    assert now[("behind-1h", "a-1")] == "pending"
    await until(lambda: all(hook.states(*k)[-1:] == ["nodata"] for k in nodata), "nodata sent")
    # /metrics: unknown is NaN (link down), and the resync counter keeps its count.
    text = svc.metrics.render().decode()
    b1 = 'primary="a-primary",region="b",replica="b-1",source="a"} '
    assert f"replag_replication_link_up{{{b1}0.0" in text
    assert f"replag_replication_rpo_bytes{{{b1}NaN" in text
    full = 'replag_replication_resyncs_total{kind="full",primary="a-primary",source="a"} '
    assert f"{full}{before.sync_full}.0" in text

    # Healed and read again: everything resolves, the pending alert is cleared unsent.
    lab_fault(lab_dir, "a", "heal")
    lab_fault(lab_dir, "b", "delay", delay_ms=1)
    await rounds_until(svc, lambda s: s == {}, "every alert resolved")
    await until(lambda: all(hook.states(*k)[-1:] == ["resolved"] for k in nodata), "resolved sent")
    assert hook.states("full-resync", "a-primary") == ["nodata", "resolved"]
    assert hook.states("behind-1h", "a-1") == []
    pending = [h["status"] for h in svc.alert_book.history(limit=500) if h["rule"] == "behind-1h"]
    assert set(pending) == {"pending", "cleared"}
    (primary,) = svc.latest_replication()
    assert primary.sync_full == before.sync_full  # a-1's reconnect was a partial resync
    assert all(r.status == "ok" and r.bytes_behind == 0 for r in primary.replicas)
