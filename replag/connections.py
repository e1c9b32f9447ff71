"""Redis clients for endpoints, and the translation of their failures into ReplagErrors.

One `redis.asyncio.Redis` (with its own pool) per endpoint, created here and
closed by whoever owns it. `endpoint_errors()` turns redis-py's exceptions
into `UnreachableError` / `AuthError` / `EndpointError` naming the endpoint
by its redacted URL, never its password. redis-py itself is imported only
where a client is made or one of its exceptions sorted: `translate` is on the
RESP path too, and importing redis-py costs more than a cron probe's start.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from replag.errors import AuthError, EndpointError, NotRedisError, UnreachableError
from replag.topology import Endpoint

if TYPE_CHECKING:
    import redis.asyncio as aioredis


@functools.cache
def _no_setinfo() -> dict[str, Any]:
    """Arguments that stop redis-py sending CLIENT SETINFO (Dynomite closes on it)."""
    import redis

    if "driver_info" in inspect.signature(redis.Redis.__init__).parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


def async_client(
    endpoint: Endpoint,
    *,
    timeout_s: float,
    max_connections: int | None = None,
    single_connection: bool = False,
) -> aioredis.Redis:
    """An asyncio client for `endpoint` (bytes in, bytes out), speaking RESP2.

    redis-py 8 opens with `HELLO 3` unless told otherwise; Dynomite closes the
    connection on it (and on CLIENT SETINFO), as do older servers and some proxies.
    replag's own RESP connection (`replag.resp`) speaks RESP2 too, so every
    connection replag opens reads replies in one shape.
    """
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aioredis.Redis(
        protocol=2,
        single_connection_client=single_connection,
        host=endpoint.host,
        port=endpoint.port,
        db=endpoint.db,
        username=endpoint.username,
        password=endpoint.password,
        ssl=endpoint.tls,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        max_connections=max_connections,
        # redis-py retries with backoff by default (seconds on a dead node); replag
        # decides itself what to retry, so a dead endpoint is reported at once.
        retry=Retry(NoBackoff(), 0),
        **_no_setinfo(),
    )


class NotRespError(ConnectionError):
    """The peer sent bytes that are not RESP: not a Redis-protocol server."""


def not_resp(sample: bytes) -> NotRespError:
    return NotRespError(f"not a Redis server: it answered {sample[:48]!r}")


def translate(exc: BaseException, endpoint: Endpoint) -> EndpointError:
    """A ReplagError for a redis-py or socket exception raised while talking to `endpoint`."""
    where = f"{endpoint.name} ({endpoint.url()})"
    text = str(exc) or type(exc).__name__
    if endpoint.password:
        text = text.replace(endpoint.password, "***")
    if isinstance(exc, NotRespError):
        return NotRedisError(text, where=where)
    if isinstance(exc, TimeoutError):
        return UnreachableError(f"timed out: {text}", where=where)
    if isinstance(exc, OSError):
        return _unreachable(text, endpoint, where)
    # Only a redis-py exception is left to sort, and redis-py is then already loaded.
    from redis.exceptions import (
        AuthenticationError,
        AuthorizationError,
        InvalidResponse,
        ResponseError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    if isinstance(exc, AuthenticationError | AuthorizationError) or (
        isinstance(exc, ResponseError)
        and any(w in text for w in ("WRONGPASS", "NOAUTH", "NOPERM", "invalid password"))
    ):
        return AuthError(f"authentication failed: {text}", where=where)
    if isinstance(exc, InvalidResponse):
        return NotRedisError(f"not a Redis server: {text}", where=where)
    if isinstance(exc, RedisTimeoutError):
        return UnreachableError(f"timed out: {text}", where=where)
    if isinstance(exc, RedisConnectionError):
        return _unreachable(text, endpoint, where)
    return EndpointError(text, where=where)


def _unreachable(text: str, endpoint: Endpoint, where: str) -> UnreachableError:
    if endpoint.kind == "dynomite" and "closed" in text.lower():
        text += " (Dynomite closes the connection on commands it does not support)"
    return UnreachableError(f"unreachable: {text}", where=where)


@contextlib.contextmanager
def endpoint_errors(endpoint: Endpoint) -> Iterator[None]:
    """Re-raise redis-py and socket errors as ReplagErrors naming `endpoint`."""
    from redis.exceptions import RedisError

    try:
        yield
    except (RedisError, OSError, TimeoutError) as exc:
        raise translate(exc, endpoint) from exc


@contextlib.asynccontextmanager
async def connected(endpoint: Endpoint, *, timeout_s: float) -> AsyncIterator[aioredis.Redis]:
    """A client that has answered PING (or raised a ReplagError), closed on exit."""
    client = async_client(endpoint, timeout_s=timeout_s)
    try:
        with endpoint_errors(endpoint):
            await client.ping()
        yield client
    finally:
        await client.aclose()
