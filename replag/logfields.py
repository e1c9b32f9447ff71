"""Log lines a platform can read: one JSON object per line, with the work's fields.

`JsonLogFormatter` writes `time`, `level`, `logger`, `message` and, where the line
was logged inside a unit of work, `unit`, `group`, `region` and `replica`. Those come
from the record (`extra={"replica": ...}`) or from `log_fields`, a context variable
the service sets once per scheduled unit (`bind_log_fields`): asyncio tasks and
`asyncio.to_thread` copy it, so every line a unit's round logs carries its name.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

FIELDS = ("unit", "group", "region", "replica")
LOG_FORMATS = ("human", "json")

log_fields: ContextVar[dict[str, str]] = ContextVar("replag_log_fields", default={})  # noqa: B039


@contextmanager
def bind_log_fields(**fields: str | None) -> Iterator[None]:
    """Lines logged inside the block (and in tasks and threads started from it) carry
    `fields` (None values are left out)."""
    merged = {**log_fields.get(), **{k: v for k, v in fields.items() if v is not None}}
    token = log_fields.set(merged)
    try:
        yield
    finally:
        log_fields.reset(token)


def unit_fields(unit_name: str) -> dict[str, str]:
    """The fields a scheduled unit's name gives: `check:GROUP` names a group,
    `probe:REGION` a region."""
    fields = {"unit": unit_name}
    kind, sep, subject = unit_name.partition(":")
    if sep and kind == "check":
        fields["group"] = subject
    elif sep and kind == "probe":
        fields["region"] = subject
    return fields


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record, on one line (a traceback goes in `exception`)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = log_fields.get()
        for name in FIELDS:
            value = getattr(record, name, None) or context.get(name)
            if value is not None:
                entry[name] = str(value)
        if record.exc_info:
            entry["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        # ensure_ascii: a message with a stray surrogate still makes one valid line
        return json.dumps(entry, ensure_ascii=True, default=str)
