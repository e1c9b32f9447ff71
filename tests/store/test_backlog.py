"""Held writes (the store cannot take them): in order, spilled to a 0600 file past the
memory budget, the oldest in memory dropped and counted past the disk budget, the file gone
once written."""

from __future__ import annotations

import stat
from pathlib import Path

from replag.store.backlog import Batch, HoldLimits, WriteBacklog


def batch(i: int) -> Batch:
    return (("INSERT INTO t (id, v) VALUES (?, ?)", (i, b"\x00" * 100)),)


def drain(backlog: WriteBacklog) -> list[int]:
    out = []
    while backlog:
        batches = backlog.peek(max_statements=7)
        out += [int(b[0][1][0]) for b in batches]
        assert all(b[0][1][1] == b"\x00" * 100 for b in batches)  # bytes survive the file
        backlog.done(batches)
    return out


def test_held_writes_spill_past_the_memory_budget_and_come_back_in_order(tmp_path: Path) -> None:
    spill = tmp_path / "held"
    backlog = WriteBacklog(HoldLimits(memory_bytes=2_000, disk_bytes=10**6, spill_dir=spill))
    for i in range(100):
        assert backlog.failed(batch(i), "away") == 0
    health = backlog.health
    assert health.deferred == 100 and 0 < health.spilled < 100 and health.dropped == 0
    [file] = spill.iterdir()
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    # A flush that fails keeps them first in line; more arrive meanwhile.
    backlog.peek()
    backlog.abort("still away")
    backlog.failed(batch(100), "away")
    assert drain(backlog) == list(range(101))
    assert health.state == "ok" and health.deferred == 0 and not list(spill.iterdir())


def test_past_the_disk_budget_the_oldest_in_memory_are_dropped_and_counted(tmp_path: Path) -> None:
    backlog = WriteBacklog(
        HoldLimits(memory_bytes=1_000, disk_bytes=3_000, spill_dir=tmp_path / "held")
    )
    dropped = sum(backlog.failed(batch(i), "away") for i in range(100))
    assert dropped > 0 and backlog.health.dropped == dropped
    kept = drain(backlog)
    assert len(kept) == 100 - dropped and kept == sorted(kept)
    # Without a spill directory the memory budget drops the oldest, as before.
    plain = WriteBacklog(HoldLimits(memory_bytes=1_000))
    assert sum(plain.failed(batch(i), "away") for i in range(50)) > 0
    assert drain(plain)[-1] == 49
