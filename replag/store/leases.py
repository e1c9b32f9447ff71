"""Leases in the store: one holder per named unit of work, with a fencing epoch.

A lease is a row (name, holder, epoch, acquired_ns, expires_ns). Learning from
where others broke:

* expiry is judged on the database's clock only (`Store.now_ns_sql`), never by
  comparing an instance's clock with the database's (Reaper's skew bug);
* renewal and release are scoped to the holder *and* its epoch, so an instance
  that lost a lease cannot renew it back by name (Oban's 19 days of cron jobs);
* the epoch grows on every takeover (a new holder, or the same one after its
  lease expired): it is the fencing token. Check it with `guard` in the
  transaction of any write made under the lease, and with `holds` before a Redis
  write batch or a notification, so a process paused past its lease does nothing.

SQLite gives the same semantics between processes of one host (its clock is the
host's); PostgreSQL between hosts.

A SQLite store that cannot be written (a full disk, a read-only file) cannot be
written by anyone: no lease can be taken over then, since a takeover is a write.
So while it is unwritable a holder keeps what the store still says is its own (at
its epoch), without renewing it, and probing and alerting go on; the first write
that goes through again judges expiry as usual. (Not on PostgreSQL: there an
unwritable store may be this instance's lost connection while others write.)
"""

from __future__ import annotations

import functools
import os
import secrets
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replag.errors import LeaseLost, StoreUnwritable

if TYPE_CHECKING:
    from replag.store.base import Store, Transaction
    from replag.store.rows import Row

_COLUMNS = "name, holder, epoch, acquired_ns, expires_ns"
# Each service instance holds `instance:ID` while it lives; `offer:NAME` says NAME's holder
# offers it to another instance (see `acquire`).
INSTANCE_PREFIX = "instance:"
OFFER_PREFIX = "offer:"


@functools.cache
def instance_id() -> str:
    """This process's holder name: host, pid and a random tail (a pid can be reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A lease as last seen; `expires_ns` is on the database's clock (UTC epoch ns)."""

    name: str
    holder: str
    epoch: int
    acquired_ns: int
    expires_ns: int

    @classmethod
    def from_row(cls, row: Row) -> Lease:
        return cls(
            name=row.name,
            holder=row.holder,
            epoch=int(row.epoch),
            acquired_ns=int(row.acquired_ns),
            expires_ns=int(row.expires_ns),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "holder": self.holder,
            "epoch": self.epoch,
            "acquired_ns": self.acquired_ns,
            "expires_ns": self.expires_ns,
        }


def acquire(
    store: Store,
    name: str,
    *,
    holder: str,
    ttl_s: float,
    live_holders: bool = False,
    offered: bool = False,
) -> Lease | None:
    """Take `name` for `ttl_s` if it is free (never taken, or released), expired, or
    already `holder`'s; None if another holder has it. Taking it from anyone (or back
    after it expired) bumps the epoch.

    `live_holders`: an expired lease whose holder still holds its `instance:` lease (a
    live instance whose renewal is late, or that has just come back from a store outage)
    is not taken. `offered`: a lease its holder offers (`offer`) is taken too, expired or
    not (a hand-over: the holder runs the unit until then)."""
    try:
        lease = _acquire(
            store, name, holder=holder, ttl_s=ttl_s, live_holders=live_holders, offered=offered
        )
    except StoreUnwritable as exc:
        if store.backend != "sqlite":
            raise
        store.note_unwritable(exc.message)
        row = _row(store, name)
        return row if row is not None and row.holder == holder else None
    store.note_writable()
    return lease


def _acquire(
    store: Store, name: str, *, holder: str, ttl_s: float, live_holders: bool, offered: bool
) -> Lease | None:
    ttl_ns = int(ttl_s * 1e9)
    expired = "leases.expires_ns <= excluded.acquired_ns"
    if live_holders:
        expired += f""" AND NOT EXISTS (SELECT 1 FROM leases AS i
            WHERE i.name = '{INSTANCE_PREFIX}' || leases.holder
            AND i.expires_ns > excluded.acquired_ns)"""
    takeable = f"leases.holder = excluded.holder OR leases.holder = '' OR ({expired})"
    if offered:
        takeable += f""" OR EXISTS (SELECT 1 FROM leases AS o
            WHERE o.name = '{OFFER_PREFIX}' || leases.name AND o.holder = leases.holder
            AND o.expires_ns > excluded.acquired_ns)"""
    with store.begin() as tx:
        now = _now(tx, store)
        rows = tx.execute(
            f"""INSERT INTO leases ({_COLUMNS}) VALUES (?, ?, 1, ?, ?)
                ON CONFLICT (name) DO UPDATE SET
                    epoch = CASE WHEN leases.holder = excluded.holder
                                  AND leases.expires_ns > excluded.acquired_ns
                                 THEN leases.epoch ELSE leases.epoch + 1 END,
                    acquired_ns = CASE WHEN leases.holder = excluded.holder
                                        AND leases.expires_ns > excluded.acquired_ns
                                       THEN leases.acquired_ns ELSE excluded.acquired_ns END,
                    holder = excluded.holder,
                    expires_ns = excluded.expires_ns
                WHERE {takeable}
                RETURNING {_COLUMNS}""",
            (name, holder, now, now + ttl_ns),
        )
    return Lease.from_row(rows[0]) if rows else None


def offer(store: Store, lease: Lease, *, ttl_s: float) -> None:
    """Offer `lease` to another holder for `ttl_s` (`acquire(…, offered=True)` takes it);
    its holder keeps it, and runs its unit, until then."""
    store.execute(
        f"""INSERT INTO leases ({_COLUMNS}) VALUES (?, ?, 1, {store.now_ns_sql},
                {store.now_ns_sql} + ?)
            ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,
                expires_ns = excluded.expires_ns""",
        (OFFER_PREFIX + lease.name, lease.holder, int(ttl_s * 1e9)),
    )


def withdraw(store: Store, lease: Lease) -> None:
    """No longer offer `lease` (its holder keeps it)."""
    store.execute(
        "DELETE FROM leases WHERE name = ? AND holder = ?",
        (OFFER_PREFIX + lease.name, lease.holder),
    )


def renew(store: Store, lease: Lease, *, ttl_s: float, revive: bool = False) -> Lease | None:
    """Extend `lease` by `ttl_s` from now if its holder still has it at its epoch and it
    has not expired; None when it is lost (stop the work it covers). With `revive`, also
    when it expired but nobody took it meanwhile (the same holder and epoch: no one else
    acted under it), as after a store outage during which nobody could take anything.
    On an unwritable SQLite store: `lease` as it stands while the store says it is still
    this holder's."""
    try:
        renewed = _renew(store, lease, ttl_s=ttl_s, revive=revive)
    except StoreUnwritable as exc:
        if store.backend != "sqlite":
            raise
        store.note_unwritable(exc.message)
        row = _row(store, lease.name)
        return row if _same(row, lease) else None
    store.note_writable()
    return renewed


def _renew(store: Store, lease: Lease, *, ttl_s: float, revive: bool) -> Lease | None:
    with store.begin() as tx:
        now = _now(tx, store)
        rows = tx.execute(
            f"""UPDATE leases SET expires_ns = ?
                WHERE name = ? AND holder = ? AND epoch = ? AND (expires_ns > ? OR ? = 1)
                RETURNING {_COLUMNS}""",
            (now + int(ttl_s * 1e9), lease.name, lease.holder, lease.epoch, now, revive),
        )
    return Lease.from_row(rows[0]) if rows else None


def release(store: Store, lease: Lease) -> bool:
    """Give `lease` up now (others may take it at once, at the next epoch); False if it
    was no longer held. The row stays with no holder, so the epoch keeps growing."""
    with store.begin() as tx:
        now = _now(tx, store)
        rows = tx.execute(
            """UPDATE leases SET expires_ns = ?, holder = ''
               WHERE name = ? AND holder = ? AND epoch = ? AND expires_ns > ? RETURNING name""",
            (now, lease.name, lease.holder, lease.epoch, now),
        )
    return bool(rows)


def holds(store: Store, lease: Lease, *, margin_s: float = 0.0) -> bool:
    """Whether `lease` is still held at its epoch, with at least `margin_s` left: ask
    before acting outside the store (a Redis write batch, a notification)."""
    with store.begin() as tx:
        return _held(tx, store, lease, margin_s)


def guard(tx: Transaction, store: Store, lease: Lease, *, margin_s: float = 0.0) -> None:
    """Inside a transaction writing under `lease`: raise LeaseLost unless it is still held
    at its epoch. On PostgreSQL the lease row stays share-locked until the transaction
    ends, so no takeover can commit between this check and the writes."""
    if not _held(tx, store, lease, margin_s):
        raise LeaseLost(
            f"lease {lease.name} (epoch {lease.epoch}) is no longer held by {lease.holder}"
        )


def current(store: Store, *, prefix: str = "") -> list[Lease]:
    """Leases not expired now, by name (optionally only names starting with `prefix`)."""
    rows = store.execute(
        f"""SELECT {_COLUMNS} FROM leases WHERE expires_ns > {store.now_ns_sql}
            AND name >= ? ORDER BY name""",
        (prefix,),
    )
    return [Lease.from_row(r) for r in rows if r.name.startswith(prefix)]


def _held(tx: Transaction, store: Store, lease: Lease, margin_s: float) -> bool:
    if store.backend == "sqlite" and store.health.state == "unwritable":
        # Nobody can take it over while nobody can write (see the module docstring).
        rows = tx.execute(
            "SELECT name FROM leases WHERE name = ? AND holder = ? AND epoch = ?",
            (lease.name, lease.holder, lease.epoch),
        )
        return bool(rows)
    lock = " FOR SHARE" if store.backend == "postgresql" else ""
    rows = tx.execute(
        f"""SELECT name FROM leases WHERE name = ? AND holder = ? AND epoch = ?
            AND expires_ns > {store.now_ns_sql} + ?{lock}""",
        (lease.name, lease.holder, lease.epoch, int(margin_s * 1e9)),
    )
    return bool(rows)


def _row(store: Store, name: str) -> Lease | None:
    rows = store.execute(f"SELECT {_COLUMNS} FROM leases WHERE name = ?", (name,))
    return Lease.from_row(rows[0]) if rows else None


def _same(row: Lease | None, lease: Lease) -> bool:
    return row is not None and (row.holder, row.epoch) == (lease.holder, lease.epoch)


def _now(tx: Transaction, store: Store) -> int:
    return int(tx.execute(f"SELECT {store.now_ns_sql} AS now_ns")[0].now_ns)
