"""Files replag writes are its owner's only: 0600, in 0700 directories it creates,
whatever the umask.

What replag keeps names keys, replicas, tokens and clients (the store and its
-wal/-shm, an agent's audit.jsonl and tree files, --keys-out, --samples-out, a
discovered topology with its passwords): every place that creates one goes
through here. A directory that already exists is left as it is (it may be /tmp,
or a home); a file that exists is narrowed to 0600 when replag writes it again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

FILE_MODE = 0o600
DIR_MODE = 0o700

_FLAGS = {
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
}


def private_dir(path: Path) -> Path:
    """`path` as a directory, each one created on the way 0700 (existing ones kept)."""
    missing: list[Path] = []
    at = path
    while not at.exists():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs
        os.chmod(directory, DIR_MODE)  # the umask may have taken bits off
    return path


def open_private(path: Path, mode: str = "w", *, encoding: str | None = "utf-8") -> IO[Any]:
    """`open(path, mode)` ("w", "a", "wb", "ab"), the file 0600 (created so, or narrowed),
    its directory made by `private_dir` when missing."""
    private_dir(path.parent)
    fd = os.open(path, _FLAGS[mode[0]], FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # an existing file keeps its mode through O_CREAT
        return open(fd, mode, encoding=None if "b" in mode else encoding)
    except BaseException:
        os.close(fd)
        raise


def write_private(path: Path, data: bytes, *, sync: bool = False) -> None:
    """Replace `path` with `data` atomically (a temporary file renamed over it), 0600."""
    tmp = path.with_name(path.name + ".tmp")
    with open_private(tmp, "wb") as out:
        out.write(data)
        if sync:
            out.flush()
            os.fsync(out.fileno())
    os.replace(tmp, path)


def narrow(*paths: Path) -> None:
    """Existing files among `paths` made 0600 (files another program created for us,
    such as SQLite's -wal and -shm, or made by an older replag). One that is not ours to
    change (another owner's, read-only) is left as it is: reading it still works."""
    for path in paths:
        try:
            os.chmod(path, FILE_MODE)
        except (FileNotFoundError, PermissionError):
            continue
