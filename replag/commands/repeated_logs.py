"""Log lines on stderr, each distinct one once: repeats are counted, not printed again.

A run that meets the same problem 200 times (a replica refusing every write) says so
in one line with a count. Under `--json` (and `--format nagios`) nothing is printed
while the command runs: stdout is the contract, and stderr gets one line per distinct
message, with its count, when the command ends.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from replag.logfields import JsonLogFormatter

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RepeatFoldingHandler(logging.Handler):
    """Prints the first of identical records (same level, logger and message); counts the
    rest and reports them in `summarise()`. `defer()` holds everything for the summary."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(FORMAT))
        self.deferred = False
        self.folding = True
        self._seen: dict[tuple[str, str, str], tuple[logging.LogRecord, int]] = {}

    def defer(self) -> None:
        self.deferred = True

    def emit(self, record: logging.LogRecord) -> None:
        if not self.folding:
            self._write(self.format(record))
            return
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


def install(level: int, log_format: str = "human") -> RepeatFoldingHandler:
    """The root logger's only stderr handler, at `level`, for one command.

    `log_format="json"`: one JSON object per line (`replag.logfields`), every record as
    it comes (a log platform counts repeats itself, and a line held back until the
    command ends would reach it late or never)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, RepeatFoldingHandler)]:
        root.removeHandler(old)
    handler = RepeatFoldingHandler()
    if log_format == "json":
        handler.setFormatter(JsonLogFormatter())
        handler.folding = False
    # As logging.basicConfig: a root that already has handlers (a test's capture) keeps them.
    if not root.handlers:
        root.addHandler(handler)
        root.setLevel(level)
    return handler


def json_logs() -> bool:
    """Whether this command logs JSON lines (servers then route uvicorn's lines here)."""
    return any(
        isinstance(h, RepeatFoldingHandler) and not h.folding for h in logging.getLogger().handlers
    )


# uvicorn's own loggers without their handlers: their records reach the root's handler,
# in the command's one format (human lines as replag's own, or JSON objects).
UVICORN_TO_ROOT: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {
        name: {"handlers": [], "propagate": True}
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
    },
}


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn.Config's `log_config`: its records through the root's handler, so a server's
    log has one format, replag's (`FORMAT`, or JSON): not uvicorn's `INFO:     …` besides."""
    return UVICORN_TO_ROOT


def stderr_line(message: str, *, prefix: str = "error: ") -> None:
    """A command's last word on stderr (an error, an interruption): `replag: error: …`, or,
    when logs are JSON, one JSON object (level error, logger replag), so that every line
    a platform reads from replag's stderr parses."""
    if json_logs():
        record = logging.LogRecord("replag", logging.ERROR, __file__, 0, message, None, None)
        sys.stderr.write(JsonLogFormatter().format(record) + "\n")
        sys.stderr.flush()
    else:
        sys.stderr.write(f"replag: {prefix}{message}\n")
        sys.stderr.flush()


def defer_logs() -> None:
    """Hold stderr log lines for the end-of-command summary (machine-readable stdout).
    JSON log lines are not held: they are machine-readable already."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, RepeatFoldingHandler) and handler.folding:
            handler.defer()
