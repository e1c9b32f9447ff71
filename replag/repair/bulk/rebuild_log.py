"""A rebuild's checkpoint in the store: where its scan of the source stands, and the
batches written but not yet verified.

A rebuild is a run like any other (`repair_runs`, kind "rebuild"; its tables are in
the store's migration 3). Its cursor is
saved only once every batch before it has been verified; each batch's keys are
saved before it is written and dropped once its copies stood or were undone. After
a kill -9 the resumed rebuild first settles those batches (a copy whose peers have
since lost the key is deleted again, as the batch's own verification would have
done), then scans on from the cursor: keys copied after it are found on the target
and left alone.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from replag.store import Store

_LENGTH = struct.Struct("<I")


def pack_keys(keys: list[bytes]) -> bytes:
    return b"".join(_LENGTH.pack(len(k)) + k for k in keys)


def unpack_keys(blob: bytes) -> list[bytes]:
    out: list[bytes] = []
    at = 0
    while at < len(blob):
        (n,) = _LENGTH.unpack_from(blob, at)
        at += _LENGTH.size
        out.append(blob[at : at + n])
        at += n
    return out


class RebuildLog:
    """One rebuild's checkpoint rows."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    def load(self) -> tuple[bytes, dict[str, Any]] | None:
        """(cursor, counters) saved last, None for a rebuild that has saved nothing."""
        rows = self.store.execute(
            "SELECT cursor, stats_json FROM repair_rebuilds WHERE run_id = ?", (self.run_id,)
        )
        return (bytes(rows[0].cursor), dict(json.loads(rows[0].stats_json))) if rows else None

    def save(self, cursor: bytes, stats: dict[str, Any]) -> None:
        self.store.execute(
            "INSERT INTO repair_rebuilds (run_id, cursor, stats_json) VALUES (?, ?, ?) "
            "ON CONFLICT (run_id) DO UPDATE SET cursor = excluded.cursor, "
            "stats_json = excluded.stats_json",
            (self.run_id, cursor, json.dumps(stats)),
        )

    def add_pending(self, batch: int, keys: list[bytes]) -> None:
        self.store.execute(
            "INSERT INTO repair_rebuild_pending (run_id, batch, keys) VALUES (?, ?, ?) "
            "ON CONFLICT (run_id, batch) DO UPDATE SET keys = excluded.keys",
            (self.run_id, batch, pack_keys(keys)),
        )

    def drop_pending(self, batch: int) -> None:
        self.store.execute(
            "DELETE FROM repair_rebuild_pending WHERE run_id = ? AND batch = ?",
            (self.run_id, batch),
        )

    def pending(self) -> list[tuple[int, list[bytes]]]:
        rows = self.store.execute(
            "SELECT batch, keys FROM repair_rebuild_pending WHERE run_id = ? ORDER BY batch",
            (self.run_id,),
        )
        return [(int(r.batch), unpack_keys(bytes(r.keys))) for r in rows]
