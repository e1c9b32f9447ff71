"""The alert outbox under a lease that lapses and is taken back, or is handed over while
its owner sends: each notification is sent once. Real stores (SQLite; the suite's
PostgreSQL for two instances), the service's LeaseKeeper, a real (slow) webhook receiver."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from replag.alerts.config import AlertSink
from replag.alerts.evaluate import AlertBook, AlertEvent, AlertSender, evaluate_and_notify
from replag.config import Config, config_from_dict
from replag.lab.postgres import LocalPostgres
from replag.service.leasing import LeaseKeeper
from replag.store import Store
from replag.store.leases import current
from tests.helpers.waiting import until, wait_until


class SlowHook:
    """Holds every request until `release` is set; counts what arrived."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
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


def _outbox_row(store: Store, event: AlertEvent, *, epoch: int) -> None:
    """A notification decided under `epoch` and not claimed by any sender yet."""
    store.execute(
        "INSERT INTO alert_outbox (fingerprint, event_json, created_ns, epoch) VALUES (?, ?, ?, ?)",
        (event.fingerprint, json.dumps({**event.to_dict(), "nodata": False,
         "decided_ns": event.decided_ns}), event.decided_ns, epoch),
    )  # fmt: skip


def _marking(book: AlertBook, url: str) -> AlertSender:
    """A sender as the service makes it: it claims rows in `book` and marks them there."""

    def delivered(events: Sequence[AlertEvent]) -> bool:
        return book.mark_delivered(events, now_ns=time.time_ns())

    sinks = [AlertSink(name="hook", kind="webhook", url=url)]
    return AlertSender(sinks, book.store, on_delivered=delivered, outbox=book)


async def test_a_lease_handed_over_while_its_owner_sends_does_not_send_it_twice(
    ha_store: str, hook: SlowHook, tmp_path: Path
) -> None:
    """The cause of a notification received twice: the owner of `alerts` offers it to share
    the work while its sender has a notification in flight; the instance taking it
    evaluates at once and must not adopt that row, nor the old owner send one the new
    one adopted. Two instances (stores, keepers, senders) on the suite's PostgreSQL."""
    cfg = config(tmp_path, hook.url)
    old, new = Store(ha_store), Store(ha_store)
    old_keeper = LeaseKeeper(old, holder="old", ttl_s=60.0, units=1)
    new_keeper = LeaseKeeper(new, holder="new", ttl_s=60.0, units=1)
    old_fence = old_keeper.try_acquire("alerts")
    assert old_fence is not None
    old_book, new_book = AlertBook(old), AlertBook(new)
    old_sender, new_sender = _marking(old_book, hook.url), _marking(new_book, hook.url)
    second = dataclasses.replace(FIRING, fingerprint="fp-loss", decided_ns=FIRING.decided_ns + 1)
    try:
        # The old owner sends a notification it decided; the receiver holds the request.
        _outbox_row(old, FIRING, epoch=old_fence.epoch)
        old_sender.submit([FIRING], fence=old_fence)
        await until(lambda: len(hook.bodies) == 1, "the old owner sends it")
        # Meanwhile it offers the lease and the other instance takes it (its local fence
        # still says valid: it learns of the hand-over at its next round).
        await asyncio.to_thread(old_keeper.offer, "alerts")
        new_fence = await asyncio.to_thread(new_keeper.try_acquire, "alerts", offered=True)
        assert new_fence is not None and new_fence.epoch > old_fence.epoch
        assert old_fence.valid()
        for _ in range(3):  # the new owner evaluates: the row is claimed by its sender
            await evaluate_and_notify(cfg, new, sender=new_sender, fence=new_fence)
        assert not new_sender.holds(FIRING)
        hook.release.set()
        await until(
            lambda: not old.execute("SELECT id FROM alert_outbox WHERE delivered_ns IS NULL"),
            "the old owner marks it delivered",
        )
        await evaluate_and_notify(cfg, new, sender=new_sender, fence=new_fence)
        assert [a["fingerprint"] for b in hook.bodies for a in b["alerts"]] == ["fp-lag"]

        # The other way round: the old owner still has one queued when the lease is gone.
        # Its claim fails (the lease moved), so it leaves it; the new owner adopts it.
        _outbox_row(old, second, epoch=old_fence.epoch)
        old_sender.submit([second], fence=old_fence)
        await until(lambda: not old_sender.holds(second), "the old owner leaves it")
        await evaluate_and_notify(cfg, new, sender=new_sender, fence=new_fence)
        await until(
            lambda: not new.execute("SELECT id FROM alert_outbox WHERE delivered_ns IS NULL"),
            "the new owner sends it",
        )
        sent = [a for b in hook.bodies for a in b["alerts"]]
        assert [a["fingerprint"] for a in sent] == ["fp-lag", "fp-loss"]
        assert sent[1]["notificationId"] == second.notification_id
    finally:
        await old_sender.close()
        await new_sender.close()
        old.close()
        new.close()


async def test_postgresql_stopped_between_a_send_and_its_mark_sends_nothing_twice(
    ha_store: str, postgres_server: LocalPostgres, hook: SlowHook, tmp_path: Path
) -> None:
    """The receiver has the notification, then PostgreSQL goes away before the delivered
    mark: the mark is held and written back once it returns, and the owner's evaluations
    meanwhile and after never send the notification again."""
    cfg = config(tmp_path, hook.url)
    store = Store(ha_store)
    keeper = LeaseKeeper(store, holder="one", ttl_s=60.0, units=1)
    fence = keeper.try_acquire("alerts")
    assert fence is not None
    book = AlertBook(store)
    sender = _marking(book, hook.url)
    try:
        _outbox_row(store, FIRING, epoch=fence.epoch)
        sender.submit([FIRING], fence=fence)
        await until(lambda: len(hook.bodies) == 1, "sent")
        await evaluate_and_notify(cfg, store, sender=sender, fence=fence)  # in flight: kept
        await asyncio.to_thread(postgres_server.stop)
        hook.release.set()  # answered: the mark cannot be written now
        await until(lambda: store.health.deferred > 0, "the mark held")
        assert sender.holds(FIRING)
        await asyncio.to_thread(postgres_server.start)
        await until(lambda: store.reachable, "the store answers again")
        for _ in range(3):  # as the held writes are written back
            await evaluate_and_notify(cfg, store, sender=sender, fence=fence)
        await until(
            lambda: (
                store.reachable
                and not store.execute("SELECT id FROM alert_outbox WHERE delivered_ns IS NULL")
            ),
            "the held mark written back",
        )
        await evaluate_and_notify(cfg, store, sender=sender, fence=fence)
        await asyncio.sleep(0.2)  # a second send, were there one, would be on its way
        assert len(hook.bodies) == 1
    finally:
        await sender.close()
        store.close()
