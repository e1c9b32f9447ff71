"""Redis clients for endpoints, their TLS, and the translation of failures into ReplagErrors.

One `redis.asyncio.Redis` (with its own pool) per endpoint, created here and
closed by whoever owns it. `tls_context()` is the one place a TLS context is
made from an endpoint's `TlsOptions`: redis-py's connections, the timing and
scan `RespConnection`, the blocking scan connection (in scan processes too)
all use it, so a CA, client certificate or server name set once applies to
every socket replag opens. `endpoint_errors()` turns redis-py's exceptions
into `UnreachableError` / `AuthError` / `TlsError` / `PermissionRefused` /
`EndpointError` naming the endpoint by its redacted URL, never its password.
redis-py itself is imported only where a client is made or one of its
exceptions sorted: `translate` is on the RESP path too, and importing redis-py
costs more than a cron probe's start.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
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
from replag.topology import Endpoint, TlsOptions

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
    options; ConfigError naming the endpoint when a CA, certificate or key cannot be read."""
    if endpoint.tls is None:
        return None
    try:
        return _context(endpoint.tls)
    except (OSError, ssl.SSLError) as exc:
        what = getattr(exc, "tls_what", "TLS files")
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(
            f"cannot load {what}: {reason}", where=translate_where(endpoint)
        ) from None


@functools.lru_cache(maxsize=64)
def _context(options: TlsOptions) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = (
        ssl.TLSVersion.TLSv1_3 if options.min_version == "1.3" else ssl.TLSVersion.TLSv1_2
    )
    if options.verify == "none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.check_hostname = options.verify == "full"
        context.verify_mode = ssl.CERT_REQUIRED
        with _loading(f"the CA {options.ca}" if options.ca else "the system's CAs"):
            if options.ca is None:
                context.load_default_certs()
            elif os.path.isdir(options.ca):
                context.load_verify_locations(capath=options.ca)
            else:
                context.load_verify_locations(cafile=options.ca)
    if options.cert or options.key:
        with _loading(f"the client certificate {options.cert} (key {options.key})"):
            if options.cert is None:
                raise ssl.SSLError("tls_key is set without tls_cert")
            context.load_cert_chain(options.cert, options.key)
    return context


@contextlib.contextmanager
def _loading(what: str) -> Iterator[None]:
    try:
        yield
    except (OSError, ssl.SSLError) as exc:
        exc.tls_what = what  # type: ignore[attr-defined]  # read by tls_context
        raise


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
    replag's own RESP connection (`replag.resp`) speaks RESP2 too, so every
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
        **_no_setinfo(),
    }
    context = tls_context(endpoint)
    if context is None:
        return aioredis.Redis(
            host=endpoint.host,
            port=endpoint.port,
            single_connection_client=single_connection,
            **options,
        )
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
    return client


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
    tls_failure = _tls_cause(exc)
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


def _tls_cause(exc: BaseException) -> ssl.SSLError | None:
    """The TLS failure behind `exc` (redis-py wraps it in its own ConnectionError)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


_UNKNOWN_CA = (2, 18, 19, 20, 21, 27)  # X509_V_ERR_*: no trusted issuer in the chain


def describe_tls_failure(exc: ssl.SSLError, endpoint: Endpoint) -> str:
    """One line saying which side's certificate failed and why: expired, wrong name,
    unknown CA, no client certificate, not a TLS port."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        code, message = exc.verify_code, exc.verify_message or str(exc)
        if code == 10:
            return "TLS: the server's certificate has expired"
        if code == 9:
            return "TLS: the server's certificate is not valid yet"
        if code == 62 or "hostname mismatch" in message.lower() or "IP address mismatch" in message:
            return (
                f"TLS: the server's certificate is not valid for {server_name(endpoint)!r} "
                "(wrong name; set tls_server_name to a name it holds)"
            )
        if code in _UNKNOWN_CA:
            ca = endpoint.tls.ca if endpoint.tls else None
            trusted = f"the CA in {ca}" if ca else "the system's CAs (set tls_ca)"
            return f"TLS: the server's certificate is signed by an unknown CA (not {trusted})"
        return f"TLS: the server's certificate was refused: {message}"
    if isinstance(exc, ssl.SSLEOFError) or "EOF OCCURRED" in str(exc).upper():
        has_cert = endpoint.tls is not None and endpoint.tls.cert is not None
        why = (
            "it may have refused our client certificate"
            if has_cert
            else "does it require a client certificate? set tls_cert and tls_key"
        )
        return f"TLS: the server closed the connection during the handshake ({why})"
    reason = (exc.reason or str(exc)).upper()
    if "CERTIFICATE_REQUIRED" in reason:
        return "TLS: the server requires a client certificate (set tls_cert and tls_key)"
    if "ALERT" in reason:
        alert = reason.split("ALERT_", 1)[-1].replace("_", " ").lower()
        return f"TLS: the server refused our client certificate ({alert})"
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER_FAILURE" in reason:
        return "TLS handshake failed: the port does not speak TLS (use redis://?)"
    if "UNSUPPORTED_PROTOCOL" in reason or "VERSION" in reason:
        return f"TLS handshake failed: no common TLS version ({exc.reason})"
    return f"TLS handshake failed: {exc.reason or exc}"


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
