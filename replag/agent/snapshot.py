"""Saving an agent's key table to disk, valid only against the very same replica data.

A snapshot is one header line (JSON) and the key table's bytes (its arrays,
then its names file's base: `TableImage.write`), written and read as streams. The header
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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from replag.agent.keytable import KeyTable
from replag.private_files import open_private

log = logging.getLogger(__name__)
FORMAT = 2  # 2: names in a file of their own beside 14 bytes a key (issue 36)


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


def save(
    path: Path,
    write: Callable[[IO[bytes]], None],
    keys: int,
    identity: ReplicaIdentity,
    shape: TableShape,
) -> int:
    """Write a header and a table (`write`, e.g. `TableImage.write`) atomically; returns
    the bytes written."""
    header = {"format": FORMAT, "identity": asdict(identity), "shape": asdict(shape), "keys": keys}
    tmp = path.with_name(path.name + ".tmp")
    with open_private(tmp, "wb") as fh:
        fh.write(json.dumps(header).encode() + b"\n")
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
        size = fh.tell()
    os.replace(tmp, path)
    return int(size)


def load(
    path: Path,
    identity: ReplicaIdentity,
    shape: TableShape,
    *,
    merge_every: int,
    directory: Path | None = None,
) -> tuple[KeyTable | None, str]:
    """The saved table if it was taken of this very data with these settings, else
    (None, why not). `directory`: where the table's names file goes."""
    try:
        with path.open("rb") as fh:
            return _load(fh, path, identity, shape, merge_every, directory)
    except FileNotFoundError:
        return None, "no snapshot"
    except OSError as exc:
        return None, f"cannot read {path}: {exc}"


def _load(
    fh: IO[bytes],
    path: Path,
    identity: ReplicaIdentity,
    shape: TableShape,
    merge_every: int,
    directory: Path | None,
) -> tuple[KeyTable | None, str]:
    try:
        header: dict[str, Any] = json.loads(fh.readline(1 << 16))
    except ValueError:
        return None, f"{path} is not a snapshot"
    if header.get("format") != FORMAT:
        return None, "snapshot of another format"
    if header.get("shape") != asdict(shape):
        return None, "snapshot made with other settings (depth, ttl_tolerance or prefix)"
    if header.get("identity") != asdict(identity):
        return None, "the replica changed since the snapshot (restart, writes or resync)"
    try:
        table = KeyTable.read_from(fh, merge_every=merge_every, directory=directory)
    except (ValueError, IndexError) as exc:
        return None, f"{path} is damaged: {exc}"
    if len(table) != header.get("keys"):
        table.close()
        return None, f"{path} is damaged: key count differs"
    return table, "loaded"
