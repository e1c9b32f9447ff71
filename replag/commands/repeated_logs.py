"""Log lines on stderr, each distinct one once: repeats are counted, not printed again.

A run that meets the same problem 200 times (a replica refusing every write) says so
in one line with a count. Under `--json` (and `--format nagios`) nothing is printed
while the command runs: stdout is the contract, and stderr gets one line per distinct
message, with its count, when the command ends.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RepeatFoldingHandler(logging.Handler):
    """Prints the first of identical records (same level, logger and message); counts the
    rest and reports them in `summarise()`. `defer()` holds everything for the summary."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(FORMAT))
        self.deferred = False
        self._seen: dict[tuple[str, str, str], tuple[logging.LogRecord, int]] = {}

    def defer(self) -> None:
        self.deferred = True

    def emit(self, record: logging.LogRecord) -> None:
        key = (record.levelname, record.name, record.getMessage())
        first, count = self._seen.get(key, (record, 0))
        self._seen[key] = (first, count + 1)
        if count == 0 and not self.deferred:
            self._write(self.format(record))

    def summarise(self) -> None:
        """What was held back: repeats with their count, and under defer() every line."""
        for first, count in self._seen.values():
            if self.deferred:
                suffix = f" ({count} times)" if count > 1 else ""
                self._write(self.format(first) + suffix)
            elif count > 1:
                self._write(f"{self.format(first)} (repeated: {count} times in all)")
        self._seen.clear()

    def _write(self, line: str) -> None:
        # sys.stderr at the time of writing (a test runner may have swapped it).
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def install(level: int) -> RepeatFoldingHandler:
    """The root logger's only stderr handler, at `level`, for one command."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, RepeatFoldingHandler)]:
        root.removeHandler(old)
    handler = RepeatFoldingHandler()
    # As logging.basicConfig: a root that already has handlers (a test's capture) keeps them.
    if not root.handlers:
        root.addHandler(handler)
        root.setLevel(level)
    return handler


def defer_logs() -> None:
    """Hold stderr log lines for the end-of-command summary (machine-readable stdout)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, RepeatFoldingHandler):
            handler.defer()
