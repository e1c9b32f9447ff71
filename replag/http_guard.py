"""What an HTTP client may hold of `serve` and `agent`: connections that send their
headers slowly (one byte a second) or not at all are closed, and open connections are
bounded.

uvicorn closes a connection idle between requests after `timeout_keep_alive`, and
answers 503 past `limit_concurrency` connections and tasks, but has no time limit on
reading a request's headers: `HeaderTimeoutProtocol` (uvicorn's httptools protocol)
closes a connection whose request has not sent all its headers within
`http_header_timeout` of its first byte (or of the connection, for the first request).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._header_timer: asyncio.TimerHandle | None = loop.call_later(
            self.header_timeout_s, self._headers_late
        )

    def _disarm(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


@functools.cache
def _protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    return type(
        "HeaderTimeoutProtocol",
        (HeaderTimeoutProtocol,),
        {"header_timeout_s": header_timeout_s},
    )


def server_options(settings: Any) -> dict[str, Any]:
    """uvicorn.Config's arguments for these bounds (http_header_timeout,
    http_keep_alive_timeout, http_max_connections)."""
    return {
        "http": _protocol(float(settings.http_header_timeout)),
        "timeout_keep_alive": max(1, round(settings.http_keep_alive_timeout)),
        "limit_concurrency": int(settings.http_max_connections),
        "h11_max_incomplete_event_size": 64 * 1024,
    }
