"""A check's or repair's progress on a terminal: one line per replica, each its latest,
rewritten in place (never replicas taking turns on one line); cleared at the end."""

from __future__ import annotations

import re

import pytest

from replag.commands.status_line import RepairProgressLine, StatusLine
from replag.repair.keyspace.progress import RepairProgress

ANSI = re.compile(r"\x1b\[\d*[A-Za-z]")


def event(replica: str, done: int) -> RepairProgress:
    return RepairProgress(
        group="g", replica=replica, phase="scan", done=done, total=1000, rate=100.0
    )


def screen(written: str) -> list[str]:
    """What a terminal shows after `written`: \\x1b[nF goes up n lines, \\x1b[2K clears
    the line, \\x1b[J clears below, \\r and \\n move as they do."""
    rows, y = [""], 0
    for token in re.split(r"(\x1b\[\d*[A-Za-z]|\n|\r)", written):
        if not token:
            continue
        if token == "\n":
            y += 1
            rows += [""] * (y + 1 - len(rows))
        elif token == "\r":
            pass  # writes below always clear their line first
        elif token.startswith("\x1b["):
            n, op = token[2:-1] or "1", token[-1]
            if op == "F":
                y -= int(n)
            elif op == "K":
                rows[y] = ""
            elif op == "J":
                del rows[y + 1 :]
                rows[y] = ""
        else:
            rows[y] += token
    return [r for r in rows if r]


def test_each_replica_keeps_its_own_line(capsys: pytest.CaptureFixture[str]) -> None:
    progress = RepairProgressLine(StatusLine(every_s=0.0))
    for done in (100, 200, 300):
        progress(event("b-1", done))
        progress(event("b-2", done + 50))
    before = capsys.readouterr().err
    shown = screen(before)
    assert shown == [
        "scan b-1: 300/1,000 keys 100/s ETA    7s",
        "scan b-2: 350/1,000 keys 100/s ETA    6s",
    ], shown
    progress.close()
    closing = capsys.readouterr().err
    assert ANSI.search(closing) and screen(before + closing) == []  # the block cleared
