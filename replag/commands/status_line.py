"""A status line for long commands on a terminal: one line on stderr, rewritten in place.

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
    """`show(text)` rewrites the line (at most every `every_s`); `close()` clears it."""

    def __init__(self, *, every_s: float = 0.2) -> None:
        self._every_s = every_s
        self._last = 0.0
        self._shown = False

    def show(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._every_s:
            return
        self._last = now
        click.echo(f"\r{text[:WIDTH]:<{WIDTH}}", nl=False, err=True)
        self._shown = True

    def close(self) -> None:
        if self._shown:
            click.echo("\r" + " " * WIDTH + "\r", nl=False, err=True)
            self._shown = False


def status_line(*, as_json: bool = False) -> StatusLine | None:
    """A StatusLine when stderr is a terminal and the output is not JSON, else None."""
    return StatusLine() if not as_json and sys.stderr.isatty() else None


class RepairProgressLine:
    """A repair's or rebuild's progress on a StatusLine: keys per replica, rate, ETA."""

    def __init__(self, line: StatusLine) -> None:
        self._line = line

    def __call__(self, event: RepairProgress) -> None:
        total = f"/{event.total:,}" if event.total else ""
        eta = f" ETA {event.eta_s:4.0f}s" if event.eta_s is not None else ""
        where = event.replica if event.replica != "*" else event.group
        self._line.show(
            f"{event.phase} {where}: {event.done:,}{total} keys {event.rate:,.0f}/s{eta}"
        )

    def close(self) -> None:
        self._line.close()


def repair_progress_line(*, as_json: bool) -> RepairProgressLine | None:
    """A RepairProgressLine when stderr is a terminal and the output is not JSON, else None."""
    line = status_line(as_json=as_json)
    return None if line is None else RepairProgressLine(line)
