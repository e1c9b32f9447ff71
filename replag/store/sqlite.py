"""The embedded store: one SQLite file (WAL), one connection behind one lock.

Writes are small and rare next to reads, so one connection serialised by an
RLock is enough; `try_execute` lets callers on an event loop give up instead of
waiting. Every sqlite3 error leaves as a StoreError naming the file:
StoreUnwritable for a full disk or a read-only file, StoreDamaged for damaged
pages or a file that is not a database.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from replag.errors import (
    ConfigError,
    StoreDamaged,
    StoreDuplicate,
    StoreError,
    StoreUnwritable,
)
from replag.private_files import narrow, open_private
from replag.store.base import Store
from replag.store.migrations import MIGRATIONS
from replag.store.rows import Rows, make_rows
from replag.store.schema import migrate

# Primary result codes (the low byte of an extended code).
_FULL, _READONLY, _IOERR, _CORRUPT, _CANTOPEN, _NOTADB = 13, 8, 10, 11, 14, 26
_UNWRITABLE = {_FULL, _READONLY, _IOERR, _CANTOPEN}
_DAMAGED = {_CORRUPT, _NOTADB}


class SqliteStore(Store):
    backend: ClassVar[Literal["sqlite", "postgresql"]] = "sqlite"
    # julianday() has millisecond resolution, plenty for leases of seconds.
    now_ns_sql: ClassVar[str] = "CAST((julianday('now') - 2440587.5) * 86400000000000 AS INTEGER)"

    def __init__(self, location: str | Path, **options: Any) -> None:
        super().__init__(location)
        self.path = Path(self.location.target).expanduser()
        self._lock = threading.RLock()
        try:
            # Created 0600 before SQLite opens it: its -wal and -shm take the file's mode.
            if not self.path.exists():
                open_private(self.path, "ab").close()
            self._conn = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=10
            )
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(
                f"cannot open the results store: {exc}", where=str(self.path)
            ) from None
        # Pages freed (a finished run's scan checkpoints) go back to the file system on
        # `reclaim`; this takes effect for stores created from now on.
        for pragma in ("auto_vacuum=INCREMENTAL", "journal_mode=WAL", "synchronous=NORMAL"):
            try:
                self._conn.execute(f"PRAGMA {pragma}")
            except sqlite3.Error as exc:
                error = self._error(exc)
                if not isinstance(error, StoreUnwritable):
                    self._conn.close()
                    raise error from None
                # A full disk: the store still reads, and its writes wait in memory.
        narrow(self.path, *(self.path.with_name(self.path.name + e) for e in ("-wal", "-shm")))
        try:
            migrate(self, MIGRATIONS)
        except BaseException:
            self._conn.close()
            raise

    # --- the interface --------------------------------------------------------

    def _execute(self, sql: str, params: Sequence[Any]) -> Rows:
        with self._lock:
            return self._run(sql, params)

    def try_execute(self, sql: str, params: Sequence[Any] = ()) -> Rows | None:
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._run(sql, params)
        finally:
            self._lock.release()

    @contextlib.contextmanager
    def begin(self) -> Iterator[_SqliteTransaction]:
        with self._lock:
            self._plain("BEGIN IMMEDIATE")
            try:
                yield _SqliteTransaction(self)
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise self._error(exc) from None

    def check_integrity(self) -> None:
        rows = self.execute("PRAGMA quick_check(1)")
        lines = str(rows[0][0]).splitlines() if rows else ["no answer"]
        verdict = "; ".join(line.strip() for line in lines if line.strip())
        if verdict != "ok":
            raise StoreDamaged(
                f"damaged store (quick_check: {verdict}); restore a backup or move the file "
                "aside to start a new one",
                where=str(self.path),
            )

    def reclaim(self) -> None:
        self.execute("PRAGMA incremental_vacuum")

    def close(self) -> None:
        self._stop_retrying()
        with self._lock:
            self._conn.close()

    # --- internals ------------------------------------------------------------

    def _run(self, sql: str, params: Sequence[Any]) -> Rows:
        try:
            cursor = self._conn.execute(sql, params)
            values = cursor.fetchall()
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        names = [d[0] for d in cursor.description] if cursor.description else None
        return make_rows(names, values, cursor.rowcount)

    def _plain(self, sql: str) -> None:
        try:
            self._conn.execute(sql)
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def _error(self, exc: sqlite3.Error) -> StoreError:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        where = str(self.path)
        if code in _UNWRITABLE:
            return StoreUnwritable(f"cannot write: {exc}", where=where)
        if code in _DAMAGED:
            return StoreDamaged(
                f"damaged store ({exc}); restore a backup or move the file aside", where=where
            )
        if isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc):
            return StoreDuplicate(str(exc), where=where)
        return StoreError(str(exc), where=where)


class _SqliteTransaction:
    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return self._store._run(sql, params)
