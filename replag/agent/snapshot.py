"""Saving an agent's key table to disk, valid only against the very same replica data.

A snapshot is one header line (JSON) and the key table's bytes. The header
holds what the entries depend on (tree depth, TTL bucket, the excluded probe
prefix) and the replica's identity when it was taken: its `run_id` (a
restart), replication id, and the write counters `rdb_changes_since_last_save`
and `rdb_last_save_time`, which move with every write, flush and save. On
start the agent loads the snapshot only if all of these are unchanged, i.e.
nothing was written to the replica since; otherwise it rescans.
Files are written to a temporary name and renamed, so a crash never leaves
half a snapshot.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from replag.agent.keytable import KeyTable
from replag.private_files import open_private

log = logging.getLogger(__name__)
FORMAT = 1


def parse_info(text: str) -> dict[str, str]:
    """INFO's `field:value` lines as a dict (sections and comments dropped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            name, _, value = line.partition(":")
            out[name] = value.strip()
    return out


@dataclass(frozen=True)
class ReplicaIdentity:
    """What must be unchanged for a saved table to still describe the replica's data."""

    run_id: str
    replid: str
    changes: str
    last_save: str

    @classmethod
    def from_info(cls, info: dict[str, str]) -> ReplicaIdentity:
        return cls(
            run_id=info.get("run_id", ""),
            replid=info.get("master_replid", ""),
            changes=info.get("rdb_changes_since_last_save", ""),
            last_save=info.get("rdb_last_save_time", ""),
        )


@dataclass(frozen=True)
class TableShape:
    """Settings the entries were computed with; a table made with others is useless."""

    depth: int
    ttl_bucket_ms: int
    exclude_prefix: str


def snapshot_path(state_dir: Path, replica: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", replica)
    return state_dir / f"{safe}.tree"


def save(path: Path, body: bytes, keys: int, identity: ReplicaIdentity, shape: TableShape) -> int:
    """Write a table's bytes (`KeyTable.to_bytes`) atomically; returns the bytes written."""
    header = {"format": FORMAT, "identity": asdict(identity), "shape": asdict(shape), "keys": keys}
    tmp = path.with_name(path.name + ".tmp")
    with open_private(tmp, "wb") as fh:
        fh.write(json.dumps(header).encode() + b"\n")
        fh.write(body)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return len(body)


def load(
    path: Path, identity: ReplicaIdentity, shape: TableShape, *, merge_every: int
) -> tuple[KeyTable | None, str]:
    """The saved table if it was taken of this very data with these settings, else
    (None, why not)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, "no snapshot"
    except OSError as exc:
        return None, f"cannot read {path}: {exc}"
    end = data.find(b"\n")
    try:
        header: dict[str, Any] = json.loads(data[:end])
    except ValueError:
        return None, f"{path} is not a snapshot"
    if header.get("format") != FORMAT:
        return None, "snapshot of another format"
    if header.get("shape") != asdict(shape):
        return None, "snapshot made with other settings (depth, ttl_tolerance or prefix)"
    if header.get("identity") != asdict(identity):
        return None, "the replica changed since the snapshot (restart, writes or resync)"
    try:
        table = KeyTable.from_bytes(memoryview(data)[end + 1 :], merge_every=merge_every)
    except (ValueError, IndexError) as exc:
        return None, f"{path} is damaged: {exc}"
    if len(table) != header.get("keys"):
        return None, f"{path} is damaged: key count differs"
    return table, "loaded"
