"""A status line for long commands on a terminal: lines on stderr, rewritten in place.

Only when stderr is a terminal and the output is not JSON, so cron logs, pipes
and `--json` consumers never see it; updates are throttled to five a second.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from replag.repair import RepairProgress

WIDTH = 78


class StatusLine:
    """`show(text)` rewrites the line (at most every `every_s`); `show_lines(lines)` a
    block of lines (one per replica), rewritten in place; `close()` clears them."""

    def __init__(self, *, every_s: float = 0.2) -> None:
        self._every_s = every_s
        self._last = 0.0
        self._shown = 0  # lines on screen

    def show(self, text: str, *, force: bool = False) -> None:
        self.show_lines([text], force=force)

    def show_lines(self, lines: list[str], *, force: bool = False) -> None:
        now = time.monotonic()
        if not lines or (not force and now - self._last < self._every_s):
            return
        self._last = now
        # Back to the block's first line, each line cleared and written again; a block
        # that shrank clears what is left below it.
        out = _to_first_line(self._shown)
        out += "\n".join(f"{CLEAR_LINE}{line[:WIDTH]}" for line in lines)
        if len(lines) < self._shown:
            out += CLEAR_BELOW
        click.echo(out, nl=False, err=True, color=True)
        self._shown = len(lines)

    def close(self) -> None:
        if self._shown:
            click.echo(_to_first_line(self._shown) + CLEAR_BELOW, nl=False, err=True, color=True)
            self._shown = 0


CLEAR_LINE = "\x1b[2K"
CLEAR_BELOW = "\x1b[J"


def _to_first_line(shown: int) -> str:
    """From the end of a block of `shown` lines to the start of its first."""
    return f"\x1b[{shown - 1}F" if shown > 1 else "\r"


def status_line(*, as_json: bool = False) -> StatusLine | None:
    """A StatusLine when stderr is a terminal and the output is not JSON, else None."""
    return StatusLine() if not as_json and sys.stderr.isatty() else None


class RepairProgressLine:
    """A repair's or rebuild's progress on a StatusLine: one line per replica (keys, rate,
    ETA), each replica's latest, in the order they first reported; never replicas taking
    turns on one line."""

    def __init__(self, line: StatusLine) -> None:
        self._line = line
        self._rows: dict[tuple[str, str], str] = {}

    def __call__(self, event: RepairProgress) -> None:
        total = f"/{event.total:,}" if event.total else ""
        eta = f" ETA {event.eta_s:4.0f}s" if event.eta_s is not None else ""
        where = event.replica if event.replica != "*" else event.group
        key = (event.group, event.replica)
        new = key not in self._rows
        self._rows[key] = (
            f"{event.phase} {where}: {event.done:,}{total} keys {event.rate:,.0f}/s{eta}"
        )
        self._line.show_lines(list(self._rows.values()), force=new)

    def close(self) -> None:
        self._line.close()


def repair_progress_line(*, as_json: bool) -> RepairProgressLine | None:
    """A RepairProgressLine when stderr is a terminal and the output is not JSON, else None."""
    line = status_line(as_json=as_json)
    return None if line is None else RepairProgressLine(line)
