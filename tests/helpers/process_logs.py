"""The logs of the processes a test started, kept in files and shown when it fails.

Every process a test starts writes its log to a file: redis-server, the lab's relays and
agents, Dynomite and PostgreSQL do already (`--logfile`, `*.log` in their directory), and
`replag` subprocesses do through `tests.helpers.cli.spawn_replag` (or `Instance` in
`tests.helpers.ha`). When a test fails, `tests/conftest.py`'s report hook adds the tail of
every such log written while it ran to its report, one section per file: the last
`TAIL_LINES` lines, the busiest files (the newest written) first.

Found without being told: every `*.log` under the session's temporary directory (each
test's `tmp_path` is in it) written since the test began. Logs kept elsewhere (the
session's PostgreSQL) are named with `keep(path)`.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

TAIL_LINES = 40
MOST_FILES = 12  # a failing test of a big lab shows its twelve busiest logs
_kept: set[Path] = set()
_began = pytest.StashKey[float]()


def keep(path: Path) -> None:
    """Show `path`'s tail too when a test that wrote to it fails."""
    _kept.add(path)


def began(item: pytest.Item) -> None:
    """The test starts now (its setup: module fixtures started for it count)."""
    item.stash[_began] = time.time()


def _tail(path: Path) -> str:
    with path.open("rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 64 * 1024))
        data = f.read()
    lines = data.decode(errors="replace").splitlines()
    cut = lines[-TAIL_LINES:]
    shown = "\n".join(cut)
    return shown if len(cut) == len(lines) else f"[… last {len(cut)} lines]\n{shown}"


def failure_sections(item: pytest.Item, basetemp: Path | None) -> list[tuple[str, str]]:
    """(title, tail) of each log written since the test began, newest first."""
    since = item.stash.get(_began, time.time()) - 1.0
    found = set(_kept)
    if basetemp is not None and basetemp.is_dir():
        found.update(basetemp.rglob("*.log"))
    written: list[tuple[float, Path]] = []
    for path in found:
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if mtime >= since and path.is_file():
            written.append((mtime, path))
    written.sort(reverse=True)
    sections = []
    for _, path in written[:MOST_FILES]:
        try:
            title = str(path.relative_to(basetemp)) if basetemp else str(path)
        except ValueError:
            title = str(path)
        sections.append((f"log {title}", _tail(path)))
    return sections
