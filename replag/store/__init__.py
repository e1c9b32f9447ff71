"""The results store: lag windows, probe runs, repair runs, alert state, replication
history and Dynomite stats, in SQLite (the embedded default) or PostgreSQL.

`Store(location)` opens either (see `replag.store.location`) and applies the
numbered migrations (`replag.store.migrations`); `replag.store.leases` holds
leases with fencing epochs for several instances on one store.
"""

from replag.store.base import Store, Transaction
from replag.store.location import StoreLocation, parse_location
from replag.store.rows import Row, Rows
from replag.store.windows import LagWindow, summarize


def _backend_class(location: StoreLocation) -> type[Store]:
    if location.backend == "postgresql":
        from replag.store.postgres import PostgresStore  # psycopg: only when asked for

        return PostgresStore
    from replag.store.sqlite import SqliteStore

    return SqliteStore


Store.backend_class = staticmethod(_backend_class)

__all__ = [
    "LagWindow",
    "Row",
    "Rows",
    "Store",
    "StoreLocation",
    "Transaction",
    "parse_location",
    "summarize",
]
