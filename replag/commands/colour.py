"""Colour in a command's text output: a breach in red, success in green, on a terminal.

Only when stdout is a terminal and `NO_COLOR` (https://no-color.org) is unset or empty,
and TERM is not `dumb`: a pipe, a file, cron's mail and `--json` get the plain text,
byte for byte. The words stay as they are (BREACH, UNREACHABLE, NOT CLEAN…): colour
only makes them easier to see, it never carries the meaning alone.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TextIO

import click

# A line that says something is wrong: red whatever the outcome.
_BAD = re.compile(
    r"^(BREACH|UNREACHABLE|CRITICAL|UNSAFE|NOT CLEAN|DIVERGENT|WARNING)\b|"
    r"\b(NOT CLEAN|NOT VERIFIED|WRITABLE)\b"
)


def colour_on(stream: TextIO | None = None) -> bool:
    """Whether text written to `stream` (default stdout) may be coloured."""
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def paint(text: str, *, ok: bool, colour: bool | None = None) -> str:
    """`text` with its bad lines in red and its last line green when `ok`, red when not."""
    if not (colour_on() if colour is None else colour):
        return text
    lines = text.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    out = []
    for i, line in enumerate(lines):
        if _BAD.search(line) or (i == last and not ok):
            line = click.style(line, fg="red", bold=True if i == last else None)
        elif i == last:
            line = click.style(line, fg="green")
        out.append(line)
    return "\n".join(out)
