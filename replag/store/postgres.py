"""The shared store: PostgreSQL through psycopg 3 and its connection pool.

Several `replag serve` instances (and cron probes) use one database: each
statement runs on a pooled connection in autocommit, `begin()` gives a real
transaction, and connections are checked before use, so a PostgreSQL restart
costs the statements that were in flight, not the process. Statements are the
same as SQLite's (`?` placeholders, rewritten to psycopg's `%s` once per
statement text). Needs the `postgres` extra: `pip install 'replag[postgres]'`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from replag.errors import (
    ConfigError,
    StoreDamaged,
    StoreDuplicate,
    StoreError,
    StoreUnreachable,
    StoreUnwritable,
)
from replag.store.base import Store
from replag.store.location import store_password
from replag.store.migrations import MIGRATIONS
from replag.store.rows import Rows, make_rows
from replag.store.schema import migrate

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

_TRY_WAIT_S = 0.05  # try_execute's longest wait for a free connection
# A statement's wait for a pooled connection before it asks whether the server is there.
_FIRST_WAIT_S = 0.5
# SQLSTATE classes: 53 insufficient resources (disk full, out of memory), 08 connection
# exception, 57P0x the server shutting down or restarting, 25006 read-only transaction.
_UNWRITABLE_STATES = ("53", "25006")
_UNREACHABLE_STATES = ("08", "57P")
_DAMAGED_STATES = ("XX001", "XX002")  # data_corrupted, index_corrupted
# A transaction whose client says nothing for this long is ended by the server, its locks
# freed: a process paused (SIGSTOP, a VM frozen) or starved inside one would otherwise hold
# its row locks for as long as it is stopped. A lease's row is share-locked by every write
# made under the lease (`leases.guard`) and locked by its renewal, so such a process would
# keep the others from taking its leases over, however long ago they expired. Store
# transactions are a few statements back to back; a client idle in one for seconds is
# stopped. Below two thirds of the shortest sensible lease_time (the lease has at least
# that left when its holder stops, renewed every third), so a takeover stays bounded by
# lease_time plus a third of it (docs/ha.md).
IDLE_IN_TRANSACTION_S = 3.0
_IDLE_IN_TRANSACTION = "25P03"  # idle_in_transaction_session_timeout
# Connections the pool opens at once when the server answers again after an outage.
_RECONNECT_CONNECTIONS = 4


class PostgresStore(Store):
    backend: ClassVar[Literal["sqlite", "postgresql"]] = "postgresql"
    now_ns_sql: ClassVar[str] = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000000)::BIGINT"

    def __init__(
        self, location: str | Path, *, pool_size: int = 8, connect_timeout_s: float = 10.0
    ) -> None:
        super().__init__(location)
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise ConfigError(
                "the PostgreSQL store needs psycopg: pip install 'replag[postgres]'",
                where=self.shown,
            ) from None
        self._psycopg = psycopg
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "application_name": "replag",
            "connect_timeout": max(1, int(connect_timeout_s)),
        }
        password = store_password()
        if password is not None:
            kwargs["password"] = password
        conninfo = self.location.target
        self._conninfo = conninfo
        self._connect_kwargs = {**kwargs, "connect_timeout": 2}
        # A first connection of our own, so a wrong host or password is one clear line now
        # (the pool would only say that it timed out).
        try:
            psycopg.connect(conninfo, **kwargs).close()
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect: {_first_line(exc)}", where=self.shown) from None
        self._pool_args: dict[str, Any] = {
            "kwargs": kwargs,
            "max_size": pool_size,
            "timeout": connect_timeout_s,
            "check": ConnectionPool.check_connection,
            "configure": _configure,
            "name": "replag-store",
        }
        self._pool: ConnectionPool[psycopg.Connection[Any]] = self._new_pool()
        try:
            migrate(self, MIGRATIONS)
        except BaseException:
            self._pool.close()
            raise

    # --- the interface --------------------------------------------------------

    def _execute(self, sql: str, params: Sequence[Any]) -> Rows:
        with self._connection() as conn:
            return self._run(conn, sql, params)

    def try_execute(self, sql: str, params: Sequence[Any] = ()) -> Rows | None:
        """`execute` if a pooled connection is free at once; None if not (every one busy,
        or PostgreSQL away and none left): callers on an event loop must not wait."""
        from psycopg_pool import PoolTimeout

        if not self.reachable:
            return None
        pool = self._pool
        try:
            conn = pool.getconn(timeout=_TRY_WAIT_S)
        except PoolTimeout:
            return None
        try:
            return self._run(conn, sql, params)
        finally:
            pool.putconn(conn)

    @contextlib.contextmanager
    def begin(self) -> Iterator[_PostgresTransaction]:
        with self._connection() as conn:
            try:
                with conn.transaction():
                    yield _PostgresTransaction(self, conn)
            except self._psycopg.Error as exc:
                raise self._error(exc) from None

    def check_integrity(self) -> None:
        # PostgreSQL checks its own pages (checksums, amcheck); answering is what we ask.
        self.execute("SELECT 1")

    def reclaim(self) -> None:
        """Nothing to do: autovacuum reuses freed space."""

    def close(self) -> None:
        self._stop_retrying()
        self._pool.close()

    # --- internals ------------------------------------------------------------

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        from psycopg_pool import PoolTimeout

        if not self.reachable:
            # Away: fail at once rather than wait for the pool's timeout (an API request,
            # a probe round's write, a lease renewal must never hang on the store); the
            # background retry (`_ping`) says when it answers again.
            reason = self.health.reason or "no connection"
            raise StoreUnreachable(
                reason if reason.startswith("unreachable") else f"unreachable: {reason}",
                where=self.shown,
            )
        pool = self._pool  # the pool it came from takes it back, if replaced meanwhile
        try:
            conn = pool.getconn(timeout=_FIRST_WAIT_S)
        except PoolTimeout:
            # Every pooled connection busy, or PostgreSQL gone: a connection of our own
            # tells which, so a statement never waits the pool's whole timeout on a store
            # that is away.
            if not self._ping(check_pool=False):
                error = StoreUnreachable(
                    "no connection: the server does not answer", where=self.shown
                )
                self.note_unreachable(error.message)
                raise error from None
            pool = self._pool
            try:
                conn = pool.getconn(timeout=_FIRST_WAIT_S)
            except PoolTimeout:
                # The server answers but the pool has no connection for us: busy, or
                # still backing off between reconnection attempts after an outage (seconds
                # after the server is back). A connection of our own, for this statement.
                yield from self._own_connection()
                return
        try:
            yield conn
        finally:
            pool.putconn(conn)

    def _own_connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            conn = self._psycopg.connect(self._conninfo, **self._connect_kwargs)
        except self._psycopg.Error as exc:
            raise self._error(exc) from None
        try:
            yield conn
        finally:
            conn.close()

    def _ping(self, *, check_pool: bool = True) -> bool:
        """A connection of its own (not the pool's, which may be backing off between its
        reconnection attempts): when it answers, the pool's dead connections are replaced."""
        try:
            self._psycopg.connect(self._conninfo, **self._connect_kwargs).close()
        except self._psycopg.Error:
            return False
        if check_pool:
            self._pool.check()
        return True

    def _reconnect(self) -> None:
        """The server answers again after an outage: a fresh pool, connecting now. The old
        one's reconnection attempts back off (1, 2, 4, 8 s…), so it could stay empty for
        seconds after the server is back, and every statement meanwhile (a lease renewal
        among them) would wait for a connection, then open one of its own: about a second
        each. Connections still out return to the old pool, which closes them."""
        # Several connections at once: the held writes take one for their replay while the
        # lease renewals, probe rounds and reads need theirs now, not as the pool grows.
        old, self._pool = self._pool, self._new_pool(min_size=_RECONNECT_CONNECTIONS)
        # Closed aside: its workers may be in a connection attempt (up to connect_timeout).
        threading.Thread(
            target=old.close, kwargs={"timeout": 15.0}, name="replag-store-old-pool", daemon=True
        ).start()

    def _new_pool(self, *, min_size: int = 1) -> ConnectionPool[psycopg.Connection[Any]]:
        from psycopg_pool import ConnectionPool

        args = {**self._pool_args, "min_size": min(min_size, self._pool_args["max_size"])}
        return ConnectionPool(self._conninfo, open=True, **args)

    def _run(self, conn: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> Rows:
        try:
            cursor = conn.execute(_placeholders(sql), _adapted(params) if params else None)
            values = cursor.fetchall() if cursor.description else []
        except self._psycopg.Error as exc:
            raise self._error(exc) from None
        names = [d.name for d in cursor.description] if cursor.description else None
        return make_rows(names, values, cursor.rowcount)

    def _error(self, exc: psycopg.Error) -> StoreError:
        state = exc.sqlstate or ""
        message = _first_line(exc)
        if (isinstance(exc, self._psycopg.OperationalError) and not state) or state.startswith(
            _UNREACHABLE_STATES
        ):
            error = StoreUnreachable(f"connection lost: {message}", where=self.shown)
            self.note_unreachable(error.message)
            return error
        if state == "23505":
            return StoreDuplicate(message, where=self.shown)
        if state == _IDLE_IN_TRANSACTION:
            return StoreError(
                f"transaction ended by the server: its client was silent in it for over "
                f"{IDLE_IN_TRANSACTION_S:g} s (paused or starved): {message}",
                where=self.shown,
            )
        if state.startswith(_UNWRITABLE_STATES):
            return StoreUnwritable(f"cannot write: {message}", where=self.shown)
        if state.startswith(_DAMAGED_STATES):
            return StoreDamaged(f"damaged data: {message}", where=self.shown)
        return StoreError(message, where=self.shown)


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Each pooled connection as it is made: see IDLE_IN_TRANSACTION_S."""
    ms = int(IDLE_IN_TRANSACTION_S * 1000)
    conn.execute(f"SET idle_in_transaction_session_timeout = {ms}")


class _PostgresTransaction:
    def __init__(self, store: PostgresStore, conn: psycopg.Connection[Any]) -> None:
        self._store = store
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return self._store._run(self._conn, sql, params)


@functools.lru_cache(maxsize=2048)
def _placeholders(sql: str) -> str:
    """`?` → `%s` and `%` → `%%`, outside quoted strings and identifiers."""
    out: list[str] = []
    quote: str | None = None
    for char in sql:
        if quote is not None:
            if char == quote:
                quote = None
            out.append("%%" if char == "%" else char)
        elif char in "'\"":
            quote = char
            out.append(char)
        elif char == "?":
            out.append("%s")
        elif char == "%":
            out.append("%%")
        else:
            out.append(char)
    return "".join(out)


def _adapted(params: Sequence[Any]) -> list[Any]:
    # SQLite stores booleans as integers and so do our tables; PostgreSQL would refuse a
    # boolean for a BIGINT column.
    return [int(p) if isinstance(p, bool) else p for p in params]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
