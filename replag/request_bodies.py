"""Request bodies bounded before anything reads them: an ASGI middleware for the service's
API and the agent's.

A request that carries a body (a Content-Length above 0, or any Transfer-Encoding) is
first asked for its bearer token: without a known one it gets 401 (403 where no
token is configured) before a byte of the body is read. A declared length above
the limit gets 413 unread; a chunked body is counted as it streams and refused the
moment it passes the limit. A JSON body is then counted for its object members
(`:` bytes, an upper bound, one C-speed pass) and refused with 413 past
`max_json_keys`, before any parser builds them. The body, whole and within bounds,
is handed to the app as it came. Every refusal closes the connection
(`Connection: close`), so the rest of a body is never read.

The route's own dependency still checks the token's scope and logs the caller;
this only makes sure no one without a token costs more than its headers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from replag.tokens import ApiToken, match

audit = logging.getLogger("replag.audit")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, kw_only=True)
class BodyLimits:
    """The bounds of one app's request bodies, and the settings that set them (named in
    the refusals)."""

    max_bytes: int
    max_json_keys: int
    bytes_setting: str
    keys_setting: str = "max_json_keys"


@dataclass(frozen=True)
class Refusal:
    status: int
    detail: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


def bearer(tokens: Sequence[ApiToken], scope: Scope, *, none_configured: str) -> ApiToken | Refusal:
    """The token the request's Authorization header holds, one of `tokens`; else the
    401 (403 with `none_configured` when there are none). Its scope is the route's to
    check."""
    if not tokens:
        return Refusal(403, none_configured)
    challenge = ((b"www-authenticate", b"Bearer"),)
    header = _header(scope, b"authorization")
    scheme, _, secret = (header or b"").decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not secret:
        return Refusal(401, "missing bearer token (Authorization: Bearer …)", challenge)
    token = match(tokens, secret.strip())
    if token is None:
        audit.warning("%s %s from %s: wrong bearer token (body not read)", scope.get("method"),
                      scope.get("path"), _client(scope))  # fmt: skip
        return Refusal(401, "wrong bearer token", challenge)
    return token


class BoundedBodies:
    """ASGI middleware: the token before the body, and the body within the limits of
    that request and token (see the module docstring). `authorize(scope)` is the app's
    token check; `limits(scope, token)` the bounds it sets."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limits: Callable[[Scope, ApiToken], BodyLimits],
        authorize: Callable[[Scope], ApiToken | Refusal],
    ) -> None:
        self.app = app
        self.limits = limits
        self.authorize = authorize

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length_header = _header(scope, b"content-length")
        streamed = _header(scope, b"transfer-encoding") is not None
        try:
            length = int(length_header) if length_header is not None else 0
        except ValueError:
            await _refuse(send, Refusal(400, "Content-Length is not a number"))
            return
        if length <= 0 and not streamed:
            await self.app(scope, receive, send)
            return
        token = self.authorize(scope)
        if isinstance(token, Refusal):
            await _refuse(send, token)
            return
        limits = self.limits(scope, token)
        if length > limits.max_bytes:
            await _refuse(send, _too_large(f"of {length} bytes", limits))
            return
        body, more = await _read(receive, limits)
        if more:
            await _refuse(send, _too_large("(chunked)", limits))
            return
        if _is_json(scope) and body.count(b":") > limits.max_json_keys:
            await _refuse(
                send,
                Refusal(
                    413,
                    f"request body: more than {limits.max_json_keys} JSON object members "
                    f"({limits.keys_setting})",
                    ((b"connection", b"close"),),
                ),
            )
            return
        if _is_json(scope) and (constant := _non_finite(body)) is not None:
            # Python's json reads NaN and Infinity, JSON has neither: refused here, before
            # a float field takes one or an error answer cannot be written back (a 500).
            await _refuse(send, Refusal(400, f"request body: {constant} is not JSON"))
            return
        await self.app(scope, _replay(body, receive), send)


class _NonFinite(Exception):
    pass


def _constant(name: str) -> float:
    raise _NonFinite(name)


def _non_finite(body: bytes) -> str | None:
    """NaN, Infinity or -Infinity if the body holds one (else None: valid JSON, or JSON
    that FastAPI refuses itself)."""
    if not any(word in body for word in (b"NaN", b"Infinity")):
        return None
    try:
        json.loads(body, parse_constant=_constant)
    except _NonFinite as exc:
        return str(exc)
    except ValueError:
        return None
    return None


async def _read(receive: Receive, limits: BodyLimits) -> tuple[bytes, bool]:
    """The body, and True if it passed the limit (the rest is left unread)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return bytes(body), False  # disconnected: the app sees what came
        chunk = message.get("body", b"")
        if len(body) + len(chunk) > limits.max_bytes:
            return b"", True
        body += chunk
        if not message.get("more_body", False):
            return bytes(body), False


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # what follows: a disconnect

    return replay


def _too_large(what: str, limits: BodyLimits) -> Refusal:
    return Refusal(
        413,
        f"request body {what}: more than {limits.bytes_setting} ({limits.max_bytes} bytes)",
        ((b"connection", b"close"),),
    )


async def _refuse(send: Send, refusal: Refusal) -> None:
    body = json.dumps({"detail": refusal.detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *(h for h in refusal.headers if h[0] != b"connection"),
    ]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


def _is_json(scope: Scope) -> bool:
    kind = _header(scope, b"content-type") or b""
    return b"json" in kind.lower() or not kind


def _client(scope: Scope) -> str:
    client = scope.get("client")
    if not client:
        return "unknown"
    host, port = client
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
