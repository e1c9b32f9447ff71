"""The store's one interface, whatever the backend: `Store(location)` opens the right one.

`Store("~/x.sqlite")` (or `sqlite:///…`) is a `SqliteStore`;
`Store("postgresql://user@host:5432/db")` a `PostgresStore`; any other scheme is
a ConfigError. Statements are written once, with `?` placeholders and the SQL
both backends speak (`INSERT … ON CONFLICT … DO UPDATE`, `RETURNING`); the
PostgreSQL backend rewrites the placeholders. Rows come back as `Row`s, read by
column name. The schema is the numbered migrations of `replag.store.migrations`,
applied when a store opens (`replag.store.schema`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, Self

from replag.store.location import StoreLocation, parse_location
from replag.store.rows import Rows
from replag.store.windows import LagWindowTables


class Transaction(Protocol):
    """Statements run on one connection, committed together when the `with` block ends."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows: ...


class Store(LagWindowTables):
    """Results store: lag windows, probe runs, and every component's tables.

    Thread-safe. Methods block (call them from a thread, `asyncio.to_thread`, on an
    event loop), except `try_execute`, which gives up at once when the store is busy.
    """

    backend: ClassVar[Literal["sqlite", "postgresql"]]
    # An SQL expression for the database's clock, UTC epoch nanoseconds (leases use it:
    # expiry is judged on one clock, the database's, never on each instance's).
    now_ns_sql: ClassVar[str]

    def __new__(cls, location: str | Path, **options: Any) -> Store:
        if cls is Store:
            parsed = parse_location(location)
            if parsed.backend == "postgresql":
                from replag.store.postgres import PostgresStore

                return super().__new__(PostgresStore)
            from replag.store.sqlite import SqliteStore

            return super().__new__(SqliteStore)
        return super().__new__(cls)

    def __init__(self, location: str | Path, **options: Any) -> None:
        self.location: StoreLocation = parse_location(location)
        self._schema_seen: set[str] = set()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.location.shown}>"

    @property
    def shown(self) -> str:
        """Where the store is, safe to print (no password)."""
        return self.location.shown

    # --- what each backend provides (SqliteStore, PostgresStore) ----------------

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        """Run one statement (in a transaction of its own) and return its rows."""
        raise NotImplementedError

    def try_execute(self, sql: str, params: Sequence[Any] = ()) -> Rows | None:
        """`execute`, or None at once when the store is busy: for callers on an event
        loop, which must not wait on a lock."""
        raise NotImplementedError

    def begin(self) -> contextlib.AbstractContextManager[Transaction]:
        """A transaction: `with store.begin() as tx: tx.execute(…)`; committed at the end
        of the block, rolled back if it raises. On SQLite it holds the write lock from
        the start (BEGIN IMMEDIATE), so a read-then-write inside it is atomic."""
        raise NotImplementedError

    def check_integrity(self) -> None:
        """Raise StoreDamaged naming the problem if the store's pages are damaged."""
        raise NotImplementedError

    def reclaim(self) -> None:
        """Give freed space back to the file system, where the backend can."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # --- shared ---------------------------------------------------------------

    def transaction(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> None:
        """Run `statements` atomically."""
        with self.begin() as tx:
            for sql, params in statements:
                tx.execute(sql, params)

    def ensure_schema(self, statements: Sequence[str]) -> None:
        """Run idempotent CREATE … IF NOT EXISTS statements, once per store object.

        Kept for components that still declare their tables themselves; new tables go
        into a numbered migration (`replag.store.migrations`) instead.
        """
        for sql in statements:
            if sql not in self._schema_seen:
                self.execute_ddl(sql)
                self._schema_seen.add(sql)

    def execute_ddl(self, sql: str) -> None:
        """Run a schema statement written in the portable dialect (see migrations)."""
        self.execute(sql)
