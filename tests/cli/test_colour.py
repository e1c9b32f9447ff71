"""Colour in text output: a breach red, success green, only on a terminal, never with
NO_COLOR (https://no-color.org), TERM=dumb, a pipe or a file; the words stay the same."""

from __future__ import annotations

import os
import pty

import click
import pytest

from replag.commands.colour import colour_on, paint

REPORT = "probe run r1 from us\n  eu  p99 3 ms\nBREACH: us→eu p99 900 ms > 500 ms\n\n2 pairs"


def test_colour_only_on_a_terminal_and_never_with_no_color(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    leader, follower = pty.openpty()
    read_end, write_end = os.pipe()
    with os.fdopen(follower, "w") as tty, os.fdopen(write_end, "w") as pipe:
        assert colour_on(tty)
        assert not colour_on(pipe)
        monkeypatch.setenv("NO_COLOR", "1")
        assert not colour_on(tty)
        monkeypatch.setenv("NO_COLOR", "")  # set but empty: no-color.org says colour
        assert colour_on(tty)
        monkeypatch.setenv("TERM", "dumb")
        assert not colour_on(tty)
    os.close(leader)
    os.close(read_end)


def test_a_breach_is_red_and_success_green_the_words_unchanged() -> None:
    bad = paint(REPORT, ok=False, colour=True)
    assert click.unstyle(bad) == REPORT
    lines = bad.split("\n")
    assert lines[2] == click.style("BREACH: us→eu p99 900 ms > 500 ms", fg="red")
    assert lines[-1] == click.style("2 pairs", fg="red", bold=True)
    assert lines[0] == "probe run r1 from us"  # the rest plain
    good = paint("probe run r1\n\n2 pairs within limits", ok=True, colour=True)
    assert good.split("\n")[-1] == click.style("2 pairs within limits", fg="green")
    assert paint(REPORT, ok=False, colour=False) == REPORT
