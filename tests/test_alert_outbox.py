"""The alert outbox under a lease that lapses and is taken back: each notification is sent
once. A real SQLite store, the service's LeaseKeeper, a real (slow) webhook receiver."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from aiohttp import web

from replag.alerts.config import AlertSink
from replag.alerts.evaluate import AlertBook, AlertEvent, AlertSender, evaluate_and_notify
from replag.config import Config, config_from_dict
from replag.service.leasing import LeaseKeeper
from replag.store import Store
from replag.store.leases import current
from tests.helpers.waiting import until, wait_until


class SlowHook:
    """Holds every request until `release` is set; counts what arrived."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        self.release = asyncio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        await self.release.wait()
        return web.Response(text="ok")


@pytest.fixture
async def hook() -> AsyncIterator[SlowHook]:
    receiver = SlowHook()
    app = web.Application()
    app.router.add_post("/", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    receiver.url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    yield receiver
    receiver.release.set()
    await runner.cleanup()


def config(tmp_path: Path, url: str) -> Config:
    return config_from_dict(
        {"settings": {"store": str(tmp_path / "s.sqlite")},
         "regions": [{"name": "a", "write": "redis://127.0.0.1:1"}],
         "alerts": {"sinks": [{"name": "hook", "kind": "webhook", "url": url}]}},
        where="outbox.toml",
    )  # fmt: skip


FIRING = AlertEvent(
    fingerprint="fp-lag", rule="lag", status="firing", labels={"alertname": "lag"},
    value=250.0, summary="p99 lag 250 ms", starts_ns=1_700_000_000 * 10**9,
    decided_ns=1_700_000_001 * 10**9,
)  # fmt: skip


async def test_an_undelivered_notification_is_sent_once_by_the_lease_holder(
    tmp_path: Path, hook: SlowHook
) -> None:
    cfg = config(tmp_path, hook.url)
    store = Store(cfg.settings.store)
    book = AlertBook(store)
    keeper = LeaseKeeper(store, holder="one", ttl_s=60.0, units=1)
    fence = keeper.try_acquire("alerts")
    assert fence is not None and fence.epoch == 1
    # Decided under this very epoch, its send stopped by the fence (the lease lapsed a
    # moment and was taken back at the same epoch): still to be sent.
    store.execute(
        "INSERT INTO alert_outbox (fingerprint, event_json, created_ns, epoch) VALUES (?, ?, ?, ?)",
        (FIRING.fingerprint, json.dumps({**FIRING.to_dict(), "nodata": False,
         "decided_ns": FIRING.decided_ns}), FIRING.decided_ns, 1),
    )  # fmt: skip

    def delivered(events: Sequence[AlertEvent]) -> bool:
        book.mark_delivered(events, now_ns=time.time_ns())
        return True

    sender = AlertSender(cfg.alerts.sinks, store, on_delivered=delivered)
    try:
        await evaluate_and_notify(cfg, store, sender=sender, fence=fence)
        await until(lambda: len(hook.bodies) == 1, "the owner sends it")
        # While the receiver holds that request, later evaluations do not send it again.
        for _ in range(3):
            await evaluate_and_notify(cfg, store, sender=sender, fence=fence)
        assert sender.holds(FIRING)
        hook.release.set()
        await until(lambda: not book.pending_outbox(through_epoch=fence.epoch), "marked sent")
        await evaluate_and_notify(cfg, store, sender=sender, fence=fence)
        await asyncio.sleep(0.2)  # a second send, were there one, would be on its way
        assert len(hook.bodies) == 1 and not sender.holds(FIRING)
    finally:
        await sender.close()

    store.close()


def test_a_fence_stays_bound_to_its_epoch(tmp_path: Path) -> None:
    # The lease expires (nothing renews it here) and this instance takes it back at a new
    # epoch: the old fence is no longer valid, so what was queued under it is not sent
    # under the new one too (the owner adopts it from the outbox instead).
    store = Store(tmp_path / "s.sqlite")
    keeper = LeaseKeeper(store, holder="one", ttl_s=0.3, units=1)
    fence = keeper.try_acquire("alerts")
    assert fence is not None and fence.valid()
    wait_until(lambda: not current(store, prefix="alerts"), "the lease expired")
    again = keeper.try_acquire("alerts")
    assert again is not None and again.epoch == fence.epoch + 1 and again.valid()
    assert not fence.valid()
    store.close()


def test_a_sink_whose_fence_fails_leaves_the_batch_to_the_outbox(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    keeper = LeaseKeeper(store, holder="one", ttl_s=30.0, units=1)
    fence = keeper.try_acquire("alerts")
    assert fence is not None
    keeper.mark_lost("alerts")  # renewal found it taken over

    async def send() -> AlertSender:
        sinks = [AlertSink(name=n, kind="webhook", url="http://127.0.0.1:9/") for n in "ab"]
        sender = AlertSender(sinks, store, on_delivered=lambda events: True)
        sender.submit([FIRING], fence=fence)
        await until(lambda: not sender.holds(FIRING), "given up to the outbox")
        await sender.close()
        return sender

    sender = asyncio.run(send())
    assert not sender.holds(FIRING)
    store.close()
