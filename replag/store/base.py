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
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, Self

from replag.errors import StoreDuplicate, StoreError, StoreUnwritable
from replag.store.backlog import Batch, HoldLimits, StoreHealth, WriteBacklog, is_write
from replag.store.location import StoreLocation, parse_location
from replag.store.rows import Rows
from replag.store.schema import ddl_for
from replag.store.windows import LagWindow, LagWindowTables, insert_window

log = logging.getLogger(__name__)
_RETURNING = re.compile(r"\bRETURNING\b", re.IGNORECASE)
# While writes fail, the deferred ones are tried again at most this often.
FLUSH_RETRY_S = 1.0
# How many distinct `last_known` reads are kept for a store outage.
_LAST_KNOWN_READS = 256


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

    # The class that opens a location's backend, set by the package (`replag.store`):
    # the backends import this module, so this module never imports them.
    backend_class: ClassVar[Callable[[StoreLocation], type[Store]]]

    def __new__(cls, location: str | Path, **options: Any) -> Store:
        if cls is Store:
            return super().__new__(Store.backend_class(parse_location(location)))
        return super().__new__(cls)

    def __init__(self, location: str | Path, **options: Any) -> None:
        self.location: StoreLocation = parse_location(location)
        self._schema_seen: set[str] = set()
        self._backlog = WriteBacklog()
        self._flushing = threading.Lock()
        self._last_flush = 0.0
        self._remembered: dict[str, dict[Hashable, Any]] = {}
        # Lag windows whose write was deferred, for the lag index (see `append_windows`).
        self.unsaved_windows: list[LagWindow] = []
        self.unsaved_generation = 0
        # Rows of `execute(…, last_known=True)` reads, answered while the store is away.
        self._last_known: OrderedDict[tuple[str, tuple[Any, ...]], Rows] = OrderedDict()
        self._state_lock = threading.Lock()
        self._retrier: threading.Thread | None = None
        self._closing = threading.Event()

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

    def _execute(self, sql: str, params: Sequence[Any]) -> Rows:
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

    def execute(self, sql: str, params: Sequence[Any] = (), *, last_known: bool = False) -> Rows:
        """Run one statement (in a transaction of its own) and return its rows.

        A write the store cannot take now (StoreUnwritable: a full disk, a read-only
        file, PostgreSQL away) is held and written later (see `replag.store.backlog`);
        its Rows are empty with `deferred` set. Reads, writes with RETURNING and writes
        inside `begin()` raise as they fail, except a read with `last_known`, which is
        answered the rows the same read last got while the store cannot be reached (what
        the service shows from memory: probe health, alert state, the instances).
        """
        if not is_write(sql) or _RETURNING.search(sql):
            # A write whose caller reads its result (a claim, a compare-and-set) is never
            # deferred: it must hear that it failed.
            if last_known:
                return self._read_last_known(sql, tuple(params))
            return self._execute(sql, params)
        return self._write(((sql, tuple(params)),), single=True)

    def _read_last_known(self, sql: str, params: tuple[Any, ...]) -> Rows:
        key = (sql, params)
        try:
            rows = self._execute(sql, params)
        except StoreUnwritable:
            with self._state_lock:
                known = self._last_known.get(key)
            if known is None:
                raise
            return known
        with self._state_lock:
            self._last_known[key] = rows
            self._last_known.move_to_end(key)
            while len(self._last_known) > _LAST_KNOWN_READS:
                self._last_known.popitem(last=False)
        return rows

    def transaction(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> bool:
        """Run `statements` atomically; False when they were deferred (see `execute`)."""
        batch = tuple((sql, tuple(params)) for sql, params in statements)
        return not self._write(batch, single=False).deferred

    @property
    def health(self) -> StoreHealth:
        """Whether writes go through, and what waits in memory if not."""
        return self._backlog.health

    def hold(self, limits: HoldLimits) -> None:
        """How much to hold while the store cannot be written (settings `store_hold_*`)."""
        self._backlog.limits = limits

    @property
    def reachable(self) -> bool:
        """False while the store cannot be reached at all (PostgreSQL away): reads fail at
        once then, and a thread tries it again every FLUSH_RETRY_S."""
        return self._backlog.health.reachable

    def flush(self) -> bool:
        """Write what was held, oldest first, if the store takes it now; True when nothing
        waits. Idempotent: a held batch whose rows are stored already (its first try went
        through, unacknowledged) is skipped; one the store refuses otherwise is dropped,
        counted and logged, never retried for ever."""
        with self._flushing:
            self._last_flush = time.monotonic()
            if not self._answers_again():
                return False
            written = 0
            while self._backlog:
                batches = self._backlog.peek()
                try:
                    dropped = self._write_batches(batches)
                except StoreUnwritable as exc:
                    self._backlog.abort(exc.message)
                    return False
                self._backlog.done(batches, dropped=dropped)
                written += sum(len(b) for b in batches) - dropped
            if self._remembered or self.unsaved_windows or written:
                self.unsaved_windows = []
                self._remembered.clear()
                self.unsaved_generation += 1
                log.warning("store %s writable again: %d held writes stored", self.shown, written)
            return True

    def _write_batches(self, batches: list[Batch]) -> int:
        """Write `batches` in one transaction, else one by one; return the statements
        dropped (refused by the store: not StoreUnwritable, which is raised)."""
        try:
            with self.begin() as tx:
                for batch in batches:
                    for sql, params in batch:
                        tx.execute(sql, params)
            return 0
        except StoreUnwritable:
            raise
        except StoreError:
            pass  # one batch is refused: find it, keep the others
        dropped = 0
        for batch in batches:
            try:
                with self.begin() as tx:
                    for sql, params in batch:
                        tx.execute(sql, params)
            except StoreDuplicate:
                log.info("store %s: a held write was stored already; skipped", self.shown)
            except StoreUnwritable:
                raise
            except StoreError as exc:
                dropped += len(batch)
                log.error("store %s: a held write refused, dropped: %s", self.shown, exc)
        return dropped

    def note_unwritable(self, reason: str) -> None:
        """A write this store does not hold for later failed as unwritable (a lease's)."""
        if self._backlog.health.state == "ok":
            log.error("store %s cannot be written (%s)", self.shown, reason)
        self._backlog.mark(reason)
        self._retry_soon()

    def note_writable(self) -> None:
        """A write went through: unless writes still wait, the store is healthy again."""
        if self._backlog.health.state != "ok" and not self._backlog:
            self._backlog.written()
            log.warning("store %s writable again", self.shown)

    def note_unreachable(self, reason: str) -> None:
        """The store cannot be reached (a connection failed): fail fast from now on, and try
        it again in the background every FLUSH_RETRY_S (`_ping`)."""
        health = self._backlog.health
        if health.reachable:
            log.error(
                "store %s cannot be reached (%s): watching goes on, writes are held until "
                "it answers",
                self.shown,
                reason,
            )
        if health.reachable:
            health.unreachable_mono = time.monotonic()
        health.reachable = False
        self._backlog.mark(reason)
        self._retry_soon()

    def _ping(self) -> bool:
        """Whether the store answers now (the background retry asks; backends override)."""
        return True

    def _answers_again(self) -> bool:
        """True if the store is reachable, or answers now after it was not."""
        health = self._backlog.health
        if health.reachable:
            return True
        if not self._ping():
            return False
        if not health.reachable:
            health.reachable = True
            health.reachable_again_mono = time.monotonic()
            self._reconnect()
            log.warning("store %s answers again", self.shown)
        return True

    def _reconnect(self) -> None:
        """The store answers again after an outage: connect afresh (backends override)."""

    def _retry_soon(self) -> None:
        """Make sure a thread retries the held writes (and an unreachable store) at most
        every FLUSH_RETRY_S until nothing waits: not only when the next write comes."""
        with self._state_lock:
            if self._retrier is not None or self._closing.is_set():
                return
            self._retrier = threading.Thread(
                target=self._retry_loop, name="replag-store-retry", daemon=True
            )
            self._retrier.start()

    def _retry_loop(self) -> None:
        while not self._closing.wait(FLUSH_RETRY_S):
            health = self._backlog.health
            try:
                if not self._answers_again():
                    continue
                if self._backlog:
                    self.flush()
                else:
                    self.note_writable()
            except StoreError as exc:
                log.debug("store %s: retry failed: %s", self.shown, exc)
            with self._state_lock:
                if health.reachable and not self._backlog and health.state == "ok":
                    self._retrier = None
                    return
        with self._state_lock:
            self._retrier = None

    def _stop_retrying(self) -> None:
        """For `close`: stop the retry thread; what is still held is lost (documented)."""
        self._closing.set()
        with self._state_lock:
            retrier = self._retrier
        if retrier is not None and retrier is not threading.current_thread():
            retrier.join(timeout=5)
        if self._backlog:
            # Info: a command says it in its own line (`replag probe`); `serve` logs it too.
            log.info(
                "store %s closed with %d writes held: they are lost",
                self.shown,
                self._backlog.health.deferred,
            )
        self._backlog.close()

    def remember(self, table: str, key: Hashable, row: Any) -> None:
        """Keep `row` (None: deleted) as `table`'s latest for `key` while writes are deferred,
        for a component that must read what it wrote (alert state, probe health)."""
        self._remembered.setdefault(table, {})[key] = row

    def remembered(self, table: str) -> dict[Hashable, Any]:
        """What `remember` kept for `table` (empty once the deferred writes are stored)."""
        return dict(self._remembered.get(table, {}))

    def append_windows(self, windows: Sequence[LagWindow]) -> None:
        if not self.transaction(insert_window(w) for w in windows):
            # Deferred: the lag index still serves them (see LagIndex.refresh).
            self.unsaved_windows = [*self.unsaved_windows, *windows]
            self.unsaved_generation += 1

    def _write(self, batch: Batch, *, single: bool) -> Rows:
        if self._flushing.locked():
            with self._flushing:  # after the writes another thread is replaying, not before
                pass
        if self._backlog and not self._flush_if_due():
            self._defer(batch, self._backlog.health.reason or "earlier writes still waiting")
            return _deferred()
        try:
            if single:
                sql, params = batch[0]
                rows = self._execute(sql, params)
            else:
                with self.begin() as tx:
                    for sql, params in batch:
                        tx.execute(sql, params)
                rows = Rows()
        except StoreUnwritable as exc:
            self._defer(batch, exc.message)
            return _deferred()
        self.note_writable()
        return rows

    def _flush_if_due(self) -> bool:
        """Try the deferred writes again, at most every FLUSH_RETRY_S; True when none wait."""
        if time.monotonic() - self._last_flush < FLUSH_RETRY_S:
            return False
        return self.flush()

    def _defer(self, batch: Batch, reason: str) -> None:
        first = not self._backlog
        spilled = self._backlog.health.spilled
        dropped = self._backlog.failed(batch, reason)
        if first:
            self._last_flush = time.monotonic()
            log.error(
                "store %s cannot be written (%s): holding writes until it can",
                self.shown,
                reason,
            )
        if spilled == 0 and self._backlog.health.spilled:
            log.warning(
                "store %s: held writes past the memory budget spilled to a local file",
                self.shown,
            )
        if dropped:
            log.error(
                "store %s: %d held writes dropped (store_hold_memory_mb/store_hold_disk_mb "
                "reached)",
                self.shown,
                dropped,
            )
        self._retry_soon()

    def ensure_schema(self, statements: Sequence[str]) -> None:
        """Run idempotent CREATE … IF NOT EXISTS statements, once per store object.

        Kept for components that still declare their tables themselves; new tables go
        into a numbered migration (`replag.store.migrations`) instead.
        """
        for sql in statements:
            if sql not in self._schema_seen:
                self._execute(ddl_for(sql, self.backend), ())
                self._schema_seen.add(sql)


def _deferred() -> Rows:
    rows = Rows()
    rows.deferred = True
    return rows
