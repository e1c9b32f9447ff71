"""Leases in the store, on SQLite and PostgreSQL: one holder, renewal scoped to holder and
epoch, the epoch grows on every takeover, and a fenced write refuses a lost lease."""

from __future__ import annotations

import threading
import time

import pytest

from replag.errors import LeaseLost, StoreError
from replag.store import Store
from replag.store.leases import (
    Lease,
    acquire,
    current,
    guard,
    holds,
    instance_id,
    offer,
    release,
    renew,
    withdraw,
)
from tests.helpers.postgres import empty_database
from tests.helpers.waiting import wait_until


def test_one_holder_at_a_time_and_the_epoch_grows_on_takeover(store: Store) -> None:
    a = acquire(store, "probe:eu", holder="a", ttl_s=30)
    assert a is not None and a.epoch == 1
    assert acquire(store, "probe:eu", holder="b", ttl_s=30) is None
    again = acquire(store, "probe:eu", holder="a", ttl_s=30)  # ours: same epoch, extended
    assert again is not None and again.epoch == 1 and again.expires_ns >= a.expires_ns
    assert release(store, a)
    b = acquire(store, "probe:eu", holder="b", ttl_s=30)
    assert b is not None and b.epoch == 2
    assert [lease.holder for lease in current(store, prefix="probe:")] == ["b"]


def test_an_expired_lease_is_taken_over_and_its_old_holder_cannot_renew_it(store: Store) -> None:
    old = acquire(store, "check:g1", holder="paused", ttl_s=0.2)
    assert old is not None
    time.sleep(0.5)  # expiry is judged on the database's clock
    new = acquire(store, "check:g1", holder="other", ttl_s=30)
    assert new is not None and new.epoch == old.epoch + 1
    # Renewal and release are scoped to holder and epoch: the old holder cannot get it back.
    assert renew(store, old, ttl_s=30) is None
    assert not release(store, old)
    assert not holds(store, old) and holds(store, new)
    # Even the same holder coming back after expiry is a takeover (a new epoch).
    time.sleep(0.05)
    assert release(store, new)
    back = acquire(store, "check:g1", holder="paused", ttl_s=30)
    assert back is not None and back.epoch == new.epoch + 1


def test_a_fenced_write_refuses_a_lost_lease(store: Store) -> None:
    lease = acquire(store, "alerts", holder=instance_id(), ttl_s=30)
    assert lease is not None
    with store.begin() as tx:
        guard(tx, store, lease)
        tx.execute("INSERT INTO store_meta (key, value) VALUES ('fenced', 1)")
    assert release(store, lease)
    acquire(store, "alerts", holder="someone-else", ttl_s=30)
    with pytest.raises(LeaseLost), store.begin() as tx:
        tx.execute("INSERT INTO store_meta (key, value) VALUES ('late', 1)")
        guard(tx, store, lease)
    rows = store.execute("SELECT key FROM store_meta ORDER BY key")
    assert [r.key for r in rows] == ["fenced"]  # the late write was rolled back


def test_racing_instances_get_one_lease(store_location: str) -> None:
    stores = [Store(store_location) for _ in range(4)]
    won: list[str] = []
    barrier = threading.Barrier(len(stores))

    def race(i: int) -> None:
        barrier.wait()
        if acquire(stores[i], "replication", holder=f"i{i}", ttl_s=30) is not None:
            won.append(f"i{i}")

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert len(won) == 1


def test_a_live_holder_is_never_robbed_and_an_offered_lease_is_handed_over(store: Store) -> None:
    me = acquire(store, "instance:a", holder="a", ttl_s=30)
    unit = acquire(store, "probe:eu", holder="a", ttl_s=0.2)
    assert me is not None and unit is not None
    time.sleep(0.5)  # the unit's lease expired, but its holder still renews its own
    assert acquire(store, "probe:eu", holder="b", ttl_s=30, live_holders=True) is None
    # Nobody took it: its holder renews it back at the same epoch (after a store outage).
    revived = renew(store, unit, ttl_s=30, revive=True)
    assert revived is not None and revived.epoch == unit.epoch
    # Offered: taken at once by an instance that asks for offered leases, not otherwise.
    offer(store, revived, ttl_s=30)
    assert acquire(store, "probe:eu", holder="b", ttl_s=30, live_holders=True) is None
    taken = acquire(store, "probe:eu", holder="b", ttl_s=30, live_holders=True, offered=True)
    assert taken is not None and taken.epoch == unit.epoch + 1
    assert renew(store, revived, ttl_s=30, revive=True) is None  # the old holder learns it
    # A dead holder's expired lease is taken; a withdrawn offer is not.
    assert release(store, me)
    offer(store, taken, ttl_s=30)
    withdraw(store, taken)
    assert acquire(store, "probe:eu", holder="c", ttl_s=30, offered=True) is None
    assert [x.holder for x in current(store, prefix="probe:")] == ["b"]


def test_a_holder_stopped_inside_a_fenced_write_does_not_keep_its_lease(
    postgres_url: str,
) -> None:
    """A holder stopped (SIGSTOP, a frozen VM) between its guard and its commit holds the
    lease row share-locked: PostgreSQL ends its silent transaction, so another instance
    takes the expired lease over, and the stopped holder's write is rolled back."""
    Store(postgres_url).close()
    empty_database(postgres_url)
    with Store(postgres_url) as paused_store, Store(postgres_url) as other:
        lease = acquire(paused_store, "probe:us-east", holder="paused", ttl_s=1)
        assert lease is not None
        outcome: list[BaseException | None] = []
        inside, resume = threading.Event(), threading.Event()

        def stopped_mid_write() -> None:
            try:
                with paused_store.begin() as tx:
                    guard(tx, paused_store, lease)  # the row share-locked from here to commit
                    tx.execute("INSERT INTO store_meta (key, value) VALUES ('stopped', 1)")
                    inside.set()
                    resume.wait(30)  # silent inside the transaction, as a stopped process
                outcome.append(None)
            except StoreError as exc:
                outcome.append(exc)

        holder = threading.Thread(target=stopped_mid_write)
        holder.start()
        taken: list[Lease] = []

        def take() -> bool:
            # Blocks on the row lock until the stopped transaction ends (without the
            # server's limit: until the holder resumes and commits under an expired lease).
            taken.extend(filter(None, [acquire(other, "probe:us-east", holder="other", ttl_s=30)]))
            return bool(taken)

        try:
            assert inside.wait(60)
            wait_until(take, "the expired lease taken over beside the stopped holder", timeout_s=60)
        finally:
            resume.set()
            holder.join()
        assert taken[0].epoch == lease.epoch + 1
        assert isinstance(outcome[0], StoreError), outcome
        assert not other.execute("SELECT key FROM store_meta WHERE key = 'stopped'")
