"""Redis clients for endpoints, their TLS, and the translation of failures into ReplagErrors.

One `redis.asyncio.Redis` (with its own pool) per endpoint, created here and
closed by whoever owns it. `tls_context()` is where an endpoint's TLS context
comes from (made by `replag.wire.tls`, as region agents' are): redis-py's
connections, the timing and scan `RespConnection`, the blocking scan
connection (in scan processes too) all use it, so a CA, client certificate or
server name set once applies to every socket replag opens. `endpoint_errors()`
turns redis-py's exceptions into `UnreachableError` / `AuthError` / `TlsError` /
`PermissionRefused` / `EndpointError` naming the endpoint by its redacted URL,
never its password.
redis-py itself is imported only where a client is made or one of its
exceptions sorted: `translate` is on the RESP path too, and importing redis-py
costs more than a cron probe's start.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from replag.errors import (
    AuthError,
    ConfigError,
    EndpointError,
    NotRedisError,
    PermissionRefused,
    TlsError,
    UnreachableError,
)
from replag.topology import Endpoint
from replag.wire import shapes
from replag.wire.reply_limits import NotRespHeader, ReplyLimitError, ReplyLimits
from replag.wire.tls import TlsFilesError, client_context, describe_failure, tls_cause

if TYPE_CHECKING:
    import redis.asyncio as aioredis


@functools.cache
def _no_setinfo() -> dict[str, Any]:
    """Arguments that stop redis-py sending CLIENT SETINFO (Dynomite closes on it)."""
    import redis

    if "driver_info" in inspect.signature(redis.Redis.__init__).parameters:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


def tls_context(endpoint: Endpoint) -> ssl.SSLContext | None:
    """The client TLS context of `endpoint` (None for redis://), made once per set of
    options (`replag.wire.tls.client_context`); ConfigError naming the endpoint when a CA,
    certificate or key cannot be read."""
    if endpoint.tls is None:
        return None
    try:
        return client_context(endpoint.tls)
    except TlsFilesError as exc:
        raise ConfigError(str(exc), where=translate_where(endpoint)) from None


def server_name(endpoint: Endpoint) -> str:
    """The name sent in SNI and checked against the server's certificate."""
    return (endpoint.tls.server_name if endpoint.tls else None) or endpoint.host


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
    replag's own RESP connection (`replag.wire.resp`) speaks RESP2 too, so every
    connection replag opens reads replies in one shape.
    """
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    options: dict[str, Any] = {
        "protocol": 2,
        "db": endpoint.db,
        "username": endpoint.username,
        "password": endpoint.password,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "max_connections": max_connections,
        # redis-py retries with backoff by default (seconds on a dead node); replag
        # decides itself what to retry, so a dead endpoint is reported at once.
        "retry": Retry(NoBackoff(), 0),
        # Replies checked against max_reply_* before hiredis allocates them.
        "parser_class": _guarded_parser_class(endpoint.limits),
        **_no_setinfo(),
    }
    context = tls_context(endpoint)
    if context is None:
        pool = aioredis.ConnectionPool(host=endpoint.host, port=endpoint.port, **options)
    else:
        # redis-py builds its own TLS context from ssl_* arguments (no server name apart
        # from the host, no CA directory beside a file): give it ours instead.
        pool = aioredis.ConnectionPool(
            connection_class=_tls_connection_class(),
            host=endpoint.host,
            port=endpoint.port,
            tls_context=context,
            tls_server_name=server_name(endpoint),
            **options,
        )
    client = aioredis.Redis(connection_pool=pool, single_connection_client=single_connection)
    client.auto_close_connection_pool = True  # the pool is this client's alone
    # Each reply's shape checked before redis-py's own parsing reads it (`shapes`).
    for command in ("INFO", "TIME", "DBSIZE", "ROLE"):
        then = client.response_callbacks.get(command, _as_is)
        client.set_response_callback(command, shapes.redis_py_callback(endpoint, command, then))
    return client


def _as_is(response: Any, **options: Any) -> Any:
    return response


@functools.cache
def _guarded_parser_class(limits: ReplyLimits) -> type:
    """redis-py's hiredis parser, feeding hiredis only what a `ReplyGuard` of `limits` has
    passed (one class per set of limits: redis-py makes the parser itself)."""
    from redis._parsers.hiredis import _AsyncHiredisParser
    from redis.exceptions import ConnectionError as RedisConnectionError

    from replag.wire.reply_limits import ReplyGuard

    class GuardedParser(_AsyncHiredisParser):
        guard: ReplyGuard

        def on_connect(self, connection: Any) -> None:
            super().on_connect(connection)  # type: ignore[no-untyped-call]
            self.guard = ReplyGuard(limits)

        async def read_from_socket(self) -> bool:
            buffer = await self._stream.read(self._read_size)  # type: ignore[union-attr]
            if not buffer or not isinstance(buffer, bytes):
                raise RedisConnectionError("Connection closed by server.")
            self.guard.feed(buffer)
            self._reader.feed(buffer)  # type: ignore[attr-defined]
            return True

    return GuardedParser


@functools.cache
def _tls_connection_class() -> type:
    """redis-py's asyncio Connection, over TLS with a context made by `tls_context`."""
    from redis.asyncio.connection import Connection

    class TlsConnection(Connection):
        def __init__(
            self, *, tls_context: ssl.SSLContext, tls_server_name: str, **kwargs: Any
        ) -> None:
            self.tls_context = tls_context
            self.tls_server_name = tls_server_name
            super().__init__(**kwargs)

        def _connection_arguments(self) -> Any:
            return {
                **super()._connection_arguments(),
                "ssl": self.tls_context,
                "server_hostname": self.tls_server_name,
            }

    return TlsConnection


class NotRespError(ConnectionError):
    """The peer sent bytes that are not RESP: not a Redis-protocol server."""


def not_resp(sample: bytes) -> NotRespError:
    return NotRespError(f"not a Redis server: it answered {sample[:48]!r}")


def translate_where(endpoint: Endpoint) -> str:
    """How errors name `endpoint`: its name and redacted URL."""
    return f"{endpoint.name} ({endpoint.url()})"


def translate(exc: BaseException, endpoint: Endpoint) -> EndpointError:
    """A ReplagError for a redis-py or socket exception raised while talking to `endpoint`."""
    where = translate_where(endpoint)
    text = str(exc) or type(exc).__name__
    if endpoint.password:
        text = text.replace(endpoint.password, "***")
    if isinstance(exc, NotRespError):
        return NotRedisError(text, where=where)
    if isinstance(exc, ReplyLimitError):
        # A server that sends what no Redis would is treated as down for this run.
        return UnreachableError(text, where=where)
    if isinstance(exc, NotRespHeader):
        return NotRedisError(f"not a Redis server: it sent {exc.args[0]!r}", where=where)
    tls_failure = tls_cause(exc)
    if tls_failure is not None:
        return TlsError(describe_tls_failure(tls_failure, endpoint), where=where)
    if isinstance(exc, TimeoutError):
        said = str(exc) if str(exc) not in ("", "timed out") else "the server does not answer"
        return UnreachableError(f"timed out: {said}", where=where)
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

    if isinstance(exc, ResponseError) and text.startswith("NOPERM"):
        return PermissionRefused(permission_refused(text, endpoint), where=where)
    if isinstance(exc, AuthenticationError | AuthorizationError) or (
        isinstance(exc, ResponseError)
        and any(w in text for w in ("WRONGPASS", "NOAUTH", "invalid password"))
    ):
        return AuthError(f"authentication failed: {text}", where=where)
    if isinstance(exc, InvalidResponse):
        return NotRedisError(f"not a Redis server: {text}", where=where)
    if isinstance(exc, RedisTimeoutError):
        return UnreachableError(f"timed out: {text}", where=where)
    if isinstance(exc, RedisConnectionError):
        return _unreachable(text, endpoint, where)
    return EndpointError(text, where=where)


def permission_refused(text: str, endpoint: Endpoint, command: str | None = None) -> str:
    """ "permission refused: GET (user replag)" from a NOPERM reply: the ACL user exists and
    authenticated, it is only not allowed this command, key or channel."""
    what = command or _refused_command(text)
    user = endpoint.username or "default"
    detail = text.removeprefix("NOPERM").strip()
    return f"permission refused: {what} (user {user}): {detail}"


def _refused_command(text: str) -> str:
    # Redis 7: "NOPERM User u has no permissions to run the 'get' command";
    # keys and channels: "… no permissions to access one of the keys/channels used …".
    if "'" in text:
        parts = text.split("'")
        if len(parts) >= 3:
            return parts[1].upper()
    if "keys" in text:
        return "a key outside the user's key patterns"
    if "channel" in text:
        return "a channel outside the user's channel patterns"
    return "a command"


def describe_tls_failure(exc: ssl.SSLError, endpoint: Endpoint) -> str:
    """One line saying which side's certificate failed and why (`replag.wire.tls`)."""
    return describe_failure(exc, tls=endpoint.tls, server_name=server_name(endpoint))


def _unreachable(text: str, endpoint: Endpoint, where: str) -> UnreachableError:
    if endpoint.kind == "dynomite" and "closed" in text.lower():
        text += " (Dynomite closes the connection on commands it does not support)"
    return UnreachableError(f"unreachable: {text}", where=where)


@contextlib.contextmanager
def endpoint_errors(endpoint: Endpoint, command: str | None = None) -> Iterator[None]:
    """Re-raise redis-py and socket errors as ReplagErrors naming `endpoint` (and, for a
    reply over a limit, `command`: what the reply answered)."""
    from redis.exceptions import RedisError

    try:
        yield
    except ReplyLimitError as exc:
        said = ReplyLimitError(f"reply to {command} refused: {exc}") if command else exc
        raise translate(said, endpoint) from exc
    except (RedisError, OSError, TimeoutError, NotRespHeader) as exc:
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
