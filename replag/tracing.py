"""Spans of a check's and a repair's steps, through OpenTelemetry's API when it is there.

`span(name, **attributes)` is a context manager: a span of the API's global tracer
provider, which `replag.otlp` sets when the `otlp_endpoint` setting is on (without it,
or without the `otel` extra installed, a no-op). Attribute names follow the semantic
conventions where they have one (db.system.name, server.address, server.port); replag's
own are under `replag.` (replag.group, replag.action, replag.replica).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import trace
except ImportError:  # the otel extra is optional
    trace = None  # type: ignore[assignment]


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    """A span named `name` around the block (errors recorded on it, then raised)."""
    if trace is None:
        yield
        return
    values = {k.replace("__", "."): v for k, v in attributes.items() if v is not None}
    with trace.get_tracer("replag").start_as_current_span(name, attributes=values):
        yield


def server(host: str, port: int) -> dict[str, Any]:
    """The semantic conventions' attributes of one Redis server (as `span()` keywords)."""
    return {"db__system__name": "redis", "server__address": host, "server__port": port}
