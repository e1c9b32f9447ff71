"""Leases in the store, on SQLite and PostgreSQL: one holder, renewal scoped to holder and
epoch, the epoch grows on every takeover, and a fenced write refuses a lost lease."""

from __future__ import annotations

import threading
import time

import pytest

from replag.errors import LeaseLost
from replag.store import Store
from replag.store.leases import acquire, current, guard, holds, instance_id, release, renew


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
