"""Whether the other instances still hold writes: one mark per instance, on the database's
clock, of the last time it had nothing held (`instance_stored`).

While the store is away every instance holds what it makes (`replag.store.backlog`):
probe runs, and the alert states it decided and sent from memory. When the store
is back, another instance cannot see those until they are written, and each
instance writes them back when its own retry finds the store answering, which may
be seconds after another one did. An instance marks itself (`mark_nothing_held`)
whenever it has nothing held; a mark written after a given moment of the database's
clock (`database_now`) says that what it held before then is stored.
"""

from __future__ import annotations

from replag.store.base import Store


def nothing_held(store: Store) -> bool:
    """Whether this process holds no write for `store` now (and it answers)."""
    return store.reachable and store.health.deferred == 0


def mark_nothing_held(store: Store, holder: str) -> int:
    """Record that `holder` has nothing held now; the mark's time (database clock). Never
    held itself: it raises as it fails (a mark written later would say nothing)."""
    rows = store.execute(
        f"""INSERT INTO instance_stored (holder, stored_ns) VALUES (?, {store.now_ns_sql})
            ON CONFLICT (holder) DO UPDATE SET stored_ns = excluded.stored_ns
            RETURNING stored_ns""",
        (holder,),
    )
    return int(rows[0].stored_ns)


def marks(store: Store) -> dict[str, int]:
    """Every instance's last mark: holder → when it had nothing held (database clock)."""
    rows = store.execute("SELECT holder, stored_ns FROM instance_stored")
    return {str(r.holder): int(r.stored_ns) for r in rows}


def database_now(store: Store) -> int:
    """The database's clock now, UTC epoch nanoseconds."""
    return int(store.execute(f"SELECT {store.now_ns_sql} AS now_ns")[0].now_ns)


def forget(store: Store, holder: str) -> None:
    """`holder` stops (its held writes are lost with it, or were written): no mark left."""
    store.execute("DELETE FROM instance_stored WHERE holder = ?", (holder,))
