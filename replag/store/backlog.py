"""Writes the store could not take (full disk, read-only file, PostgreSQL away), held in
order and written when the store takes writes again.

Probing and alerting must not stop because the store cannot be written: a
plain write (an INSERT, UPDATE or DELETE outside an explicit transaction, or a
`transaction()` batch) that fails with StoreUnwritable is held here instead,
and written back, oldest first, by the store's retry (at most once a second)
or the next write. Held writes live in memory up to a budget
(`store_hold_memory_mb`); past it the oldest are spilled to a local file
(`store_spill_dir`, mode 0600, one per process, removed once written back),
up to `store_hold_disk_mb`; past that, new writes are dropped and counted.
What is held is invisible to reads, except where a component keeps its own
view of what it wrote meanwhile (`Store.unsaved_windows`, `Store.remember`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
    errors: int = 0  # writes that failed (each then held)
    deferred: int = 0  # statements held now (in memory and spilled)
    deferred_bytes: int = 0  # of which in memory
    spilled: int = 0  # statements held in the spill file now
    spilled_bytes: int = 0
    dropped: int = 0  # statements given up on (over the budget, or refused on replay)
    recovered: int = 0  # times the held writes were written after a spell of failures
    reachable: bool = True  # False while PostgreSQL cannot be reached at all
    unreachable_mono: float | None = None  # time.monotonic() when it stopped answering
    reachable_again_mono: float | None = None  # …and when it last answered again

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "since_ns": self.since_ns,
            "reachable": self.reachable,
            "errors": self.errors,
            "deferred": self.deferred,
            "deferred_bytes": self.deferred_bytes + self.spilled_bytes,
            "spilled": self.spilled,
            "dropped": self.dropped,
            "recovered": self.recovered,
        }


@dataclass(kw_only=True)
class HoldLimits:
    """How much a store holds while it cannot be written (settings `store_hold_*`)."""

    max_statements: int = 200_000
    memory_bytes: int = 256 * 1024 * 1024
    disk_bytes: int = 0  # 0: no spill file (past memory the oldest are dropped)
    spill_dir: Path | None = None


@dataclass
class WriteBacklog:
    limits: HoldLimits = field(default_factory=HoldLimits)
    health: StoreHealth = field(default_factory=StoreHealth)
    # Every spilled batch is older than every batch in memory: the file is read first.
    _batches: deque[Batch] = field(default_factory=deque)
    _spill: _SpillFile | None = None
    _in_flight: bool = False  # a flush writes the batches it peeked: none moves meanwhile
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __bool__(self) -> bool:
        return bool(self._batches) or (self._spill is not None and self._spill.count > 0)

    def failed(self, batch: Batch, reason: str) -> int:
        """`batch` could not be written: hold it (spilling or dropping past the budget);
        return how many statements were dropped by this call."""
        with self._lock:
            h = self.health
            self._mark(reason)
            dropped_before = h.dropped
            self._batches.append(batch)
            h.deferred += len(batch)
            h.deferred_bytes += _size(batch)
            while (
                not self._in_flight
                and self._batches
                and (
                    h.deferred - h.spilled > self.limits.max_statements
                    or h.deferred_bytes > self.limits.memory_bytes
                )
            ):
                old = self._batches.popleft()
                h.deferred_bytes -= _size(old)
                if not self._spill_one(old):
                    h.deferred -= len(old)
                    h.dropped += len(old)
            return h.dropped - dropped_before

    def _spill_one(self, batch: Batch) -> bool:
        """Move `batch` (the oldest in memory) to the end of the spill file; False when
        there is no spill file or it is full (the batch is then dropped)."""
        limits, h = self.limits, self.health
        if limits.spill_dir is None or limits.disk_bytes <= 0:
            return False
        if self._spill is None:
            self._spill = _SpillFile.create(limits.spill_dir)
        if self._spill.size + _size(batch) > limits.disk_bytes:
            return False
        self._spill.append(batch)
        h.spilled += len(batch)
        h.spilled_bytes = self._spill.size - self._spill.read_pos
        return True

    def mark(self, reason: str) -> None:
        """A write that is not held here failed (a lease renewal): the store is unwritable."""
        with self._lock:
            self._mark(reason)

    def _mark(self, reason: str) -> None:
        h = self.health
        if h.state == "ok":
            h.state, h.since_ns = "unwritable", time.time_ns()
        h.reason = reason
        h.errors += 1

    def peek(self, max_statements: int = 2000) -> list[Batch]:
        """The oldest held batches, at least one and about `max_statements` statements
        (spilled ones first); `done` removes them once written."""
        with self._lock:
            self._in_flight = True
            if self._spill is not None and self._spill.count > 0:
                return self._spill.peek(max_statements)
            out: list[Batch] = []
            n = 0
            for batch in self._batches:
                if out and n + len(batch) > max_statements:
                    break
                out.append(batch)
                n += len(batch)
            return out

    def done(self, batches: list[Batch], *, dropped: int = 0) -> None:
        """`batches` (from `peek`) are written (or given up on: `dropped` statements of
        them): forget them; once nothing is held the store is healthy again."""
        with self._lock:
            self._in_flight = False
            h = self.health
            statements = sum(len(b) for b in batches)
            if self._spill is not None and self._spill.count > 0:
                self._spill.advance(len(batches))
                h.spilled -= statements
                h.spilled_bytes = self._spill.size - self._spill.read_pos
                if self._spill.count == 0:
                    self._spill.remove()
                    self._spill = None
                    h.spilled = h.spilled_bytes = 0
            else:
                for _ in batches:
                    h.deferred_bytes -= _size(self._batches.popleft())
            h.deferred -= statements
            h.dropped += dropped
            if not self:
                self._healthy()

    def abort(self, reason: str) -> None:
        """The batches `peek` gave could not be written: they stay, first in line."""
        with self._lock:
            self._in_flight = False
            self._mark(reason)

    def written(self) -> None:
        """A write went through and nothing is held: the store is healthy again."""
        with self._lock:
            if not self:
                self._healthy()

    def _healthy(self) -> None:
        h = self.health
        if h.state != "ok":
            h.recovered += 1
        h.state, h.reason, h.since_ns = "ok", None, None
        h.deferred = h.deferred_bytes = h.spilled = h.spilled_bytes = 0

    def close(self) -> None:
        """The process ends: remove the spill file (what it held is lost, as documented)."""
        with self._lock:
            if self._spill is not None:
                self._spill.remove()
                self._spill = None


class _SpillFile:
    """Held batches past the memory budget, one JSON line each, read from `read_pos`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        self.read_pos = 0
        self.count = 0
        self._peeked: list[int] = []  # each peeked batch's line length, for `advance`

    @classmethod
    def create(cls, directory: Path) -> _SpillFile:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = directory / f"replag-held-{os.getpid()}-{secrets.token_hex(3)}.jsonl"
        # 0600 from the first byte: held rows may name hosts and keys.
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return cls(path)

    def append(self, batch: Batch) -> None:
        line = json.dumps([[sql, [_encode(p) for p in params]] for sql, params in batch])
        data = (line + "\n").encode()
        with self.path.open("ab") as f:
            f.write(data)
        self.size += len(data)
        self.count += 1

    def peek(self, max_statements: int) -> list[Batch]:
        out: list[Batch] = []
        self._peeked = []
        n = 0
        with self.path.open("rb") as f:
            f.seek(self.read_pos)
            for raw in f:
                batch = tuple(
                    (sql, tuple(_decode(p) for p in params)) for sql, params in json.loads(raw)
                )
                if out and n + len(batch) > max_statements:
                    break
                out.append(batch)
                self._peeked.append(len(raw))
                n += len(batch)
        return out

    def advance(self, batches: int) -> None:
        self.read_pos += sum(self._peeked[:batches])
        self.count -= batches
        self._peeked = []

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        return base64.b64decode(value["b"])
    return value
