"""Fetching Dynomite admin answers over HTTP, with a timeout and one error per failure.

Dynomite's stats port labels every answer `application/json`, even its CRLF
plain-text ones, so bodies are read as text and the caller decides how to parse.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from replag.errors import DiscoveryError, UnreachableError
from replag.wire import reply_limits


async def fetch_text(url: str, *, timeout_s: float) -> str | None:
    """The body of `url` as text; None on 404 (an endpoint this Dynomite lacks)."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, allow_redirects=False) as response,
        ):
            if response.status == 404:
                return None
            if response.status != 200:
                raise DiscoveryError(f"answered HTTP {response.status}", where=url)
            body = await _bounded_body(response, url)
    except TimeoutError:
        raise UnreachableError(f"no answer within {timeout_s:g}s", where=url) from None
    except aiohttp.ClientPayloadError as exc:
        raise DiscoveryError(f"the answer was cut short ({exc})", where=url) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise UnreachableError(f"unreachable: {exc}", where=url) from None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise DiscoveryError("the answer is not UTF-8 text", where=url) from None


async def _bounded_body(response: aiohttp.ClientResponse, url: str) -> bytes:
    """The body, refused once it passes max_reply_bytes (whatever the server announces)."""
    limit = reply_limits.DEFAULT.max_bytes
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            shown = reply_limits.size_text(limit)
            raise DiscoveryError(f"the answer passed max_reply_bytes = {shown}", where=url)
        chunks.append(chunk)
    return b"".join(chunks)


async def fetch_required_text(url: str, *, timeout_s: float) -> str:
    """Like `fetch_text`, but a 404 is an error."""
    text = await fetch_text(url, timeout_s=timeout_s)
    if text is None:
        raise DiscoveryError("answered HTTP 404 (is this a Dynomite stats port?)", where=url)
    return text


async def fetch_json_object(url: str, *, timeout_s: float) -> dict[str, Any]:
    """The JSON object at `url`; DiscoveryError saying what was wrong otherwise."""
    text = await fetch_required_text(url, timeout_s=timeout_s)
    if not text.strip():
        raise DiscoveryError("the answer is empty", where=url)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        cut = exc.pos >= len(text.rstrip())
        what = "ends early (truncated JSON)" if cut else f"is not valid JSON ({exc.msg})"
        raise DiscoveryError(
            f"the answer {what} at line {exc.lineno} column {exc.colno}", where=url
        ) from None
    if not isinstance(data, dict):
        raise DiscoveryError(f"expected a JSON object, got {type(data).__name__}", where=url)
    return data
