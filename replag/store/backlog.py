"""Writes the store could not take (full disk, read-only file, PostgreSQL away), kept in
memory in order and written when the store takes writes again.

Probing and alerting must not stop because the store cannot be written: a
plain write (an INSERT, UPDATE or DELETE outside an explicit transaction, or a
`transaction()` batch) that fails with StoreUnwritable is queued here instead,
and the next write first replays the queue. The queue is bounded (statements
and bytes); past the bound the oldest batches are dropped and counted. What is
queued is invisible to reads, except where a component keeps its own view of
what it wrote meanwhile (`Store.unsaved_windows`, `Store.remember`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Batch = tuple[tuple[str, Sequence[Any]], ...]
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "WITH")


def is_write(sql: str) -> bool:
    return sql.lstrip().split(None, 1)[0].upper() in _WRITES if sql.strip() else False


def _size(batch: Batch) -> int:
    return sum(
        len(sql) + sum(len(p) if isinstance(p, bytes | str) else 8 for p in params)
        for sql, params in batch
    )


@dataclass
class StoreHealth:
    """What the store's writes have been like: the service's health and metrics read it."""

    state: Literal["ok", "unwritable"] = "ok"
    reason: str | None = None
    since_ns: int | None = None
    errors: int = 0  # writes that failed (each then deferred)
    deferred: int = 0  # statements waiting in memory now
    deferred_bytes: int = 0
    dropped: int = 0  # statements given up on (the queue was full)
    recovered: int = 0  # times the queue was written after a spell of failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "since_ns": self.since_ns,
            "errors": self.errors,
            "deferred": self.deferred,
            "dropped": self.dropped,
            "recovered": self.recovered,
        }


@dataclass
class WriteBacklog:
    max_statements: int = 200_000
    max_bytes: int = 256 * 1024 * 1024
    health: StoreHealth = field(default_factory=StoreHealth)
    _batches: deque[Batch] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __bool__(self) -> bool:
        return bool(self._batches)

    def failed(self, batch: Batch, reason: str) -> None:
        """`batch` could not be written: queue it (dropping the oldest past the bound)."""
        with self._lock:
            h = self.health
            if h.state == "ok":
                h.state, h.since_ns = "unwritable", time.time_ns()
            h.reason = reason
            h.errors += 1
            self._batches.append(batch)
            h.deferred += len(batch)
            h.deferred_bytes += _size(batch)
            while self._batches and (
                h.deferred > self.max_statements or h.deferred_bytes > self.max_bytes
            ):
                old = self._batches.popleft()
                h.deferred -= len(old)
                h.deferred_bytes -= _size(old)
                h.dropped += len(old)

    def mark(self, reason: str) -> None:
        """A write that is not kept here failed (a lease renewal): the store is unwritable."""
        with self._lock:
            h = self.health
            if h.state == "ok":
                h.state, h.since_ns = "unwritable", time.time_ns()
            h.reason = reason
            h.errors += 1

    def take(self) -> list[Batch]:
        """Everything queued, oldest first (put back with `put_back` if it fails again)."""
        with self._lock:
            out = list(self._batches)
            self._batches.clear()
            return out

    def put_back(self, batches: list[Batch], reason: str) -> None:
        with self._lock:
            self._batches.extendleft(reversed(batches))
            self.health.reason = reason
            self.health.errors += 1

    def written(self, batches: list[Batch]) -> None:
        """`batches` (from `take`) are in the store now."""
        with self._lock:
            h = self.health
            for batch in batches:
                h.deferred -= len(batch)
                h.deferred_bytes -= _size(batch)
            if not self._batches:
                if h.state != "ok":
                    h.recovered += 1
                h.state, h.reason, h.since_ns = "ok", None, None
                h.deferred = h.deferred_bytes = 0
