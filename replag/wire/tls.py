"""TLS contexts made from `TlsOptions`, and a failed handshake said in one line.

The one place replag makes a TLS context: `client_context` for every socket it
opens as a client (Redis endpoints through `replag.wire.connections.tls_context`, and
region agents' HTTPS from the coordinator), `server_context` for `replag agent`'s
HTTPS (with client certificates required when it has a client CA). A file that
cannot be read names itself and what it is for; `describe_failure` says which
side's certificate failed and why (expired, wrong name, unknown CA, a client
certificate missing or refused) with the keys that would fix it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import ssl
import time
from collections.abc import Iterator

from replag.topology import TlsOptions


class TlsFilesError(ValueError):
    """A CA, certificate or key could not be loaded; the message says which and why."""


@functools.lru_cache(maxsize=64)
def client_context(options: TlsOptions) -> ssl.SSLContext:
    """The client context of `options`, made once per set of options; TlsFilesError when
    a CA, certificate or key cannot be read."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = _version(options.min_version)
    if options.verify == "none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.check_hostname = options.verify == "full"
        context.verify_mode = ssl.CERT_REQUIRED
        with _loading(f"the CA {options.ca}" if options.ca else "the system's CAs"):
            if options.ca is None:
                context.load_default_certs()
            else:
                _load_ca(context, options.ca)
    if options.cert or options.key:
        with _loading(f"the client certificate {options.cert} (key {options.key})"):
            if options.cert is None:
                raise ssl.SSLError("tls_key is set without tls_cert")
            context.load_cert_chain(options.cert, options.key)
        _check_not_expired(options.cert)
    return context


def _check_not_expired(cert: str) -> None:
    """TlsFilesError if our own certificate has expired: a server refuses it during the
    handshake, often without saying why (asyncio servers send no alert)."""
    try:
        # The only reader of a PEM certificate's dates in the standard library.
        not_after = ssl._ssl._test_decode_cert(cert)["notAfter"]  # type: ignore[attr-defined]
        expires = ssl.cert_time_to_seconds(not_after)
    except (AttributeError, KeyError, ValueError, OSError, ssl.SSLError):
        return  # unreadable here: the handshake will say
    if expires < time.time():
        raise TlsFilesError(f"the client certificate {cert} has expired ({not_after})")


def server_context(
    cert: str, key: str | None, *, client_ca: str | None, min_version: str = "1.2"
) -> ssl.SSLContext:
    """A server context presenting `cert`; with `client_ca`, every client must present a
    certificate signed by it (mutual TLS). TlsFilesError naming a file that cannot be read."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _version(min_version)
    with _loading(f"the certificate {cert} (key {key or cert})"):
        context.load_cert_chain(cert, key)
    if client_ca is not None:
        with _loading(f"the client CA {client_ca}"):
            _load_ca(context, client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _version(text: str) -> ssl.TLSVersion:
    return ssl.TLSVersion.TLSv1_3 if text == "1.3" else ssl.TLSVersion.TLSv1_2


def _load_ca(context: ssl.SSLContext, ca: str) -> None:
    if os.path.isdir(ca):
        context.load_verify_locations(capath=ca)
    else:
        context.load_verify_locations(cafile=ca)


@contextlib.contextmanager
def _loading(what: str) -> Iterator[None]:
    try:
        yield
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TlsFilesError(f"cannot load {what}: {reason}") from None


def tls_cause(exc: BaseException) -> ssl.SSLError | None:
    """The TLS failure behind `exc` (redis-py and aiohttp wrap it in their own errors)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        # aiohttp's TLS errors are ssl.SSLErrors themselves, without the reason: the
        # one ssl raised is kept as an attribute.
        wrapped = getattr(seen, "certificate_error", None) or getattr(seen, "os_error", None)
        if isinstance(wrapped, ssl.SSLError):
            return wrapped
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


CLOSED = "closed"  # the server closed the connection after the handshake, answering nothing


def refusal_after_handshake(
    host: str, port: int, context: ssl.SSLContext, server_name: str, *, timeout_s: float
) -> ssl.SSLError | str | None:
    """Connect once more, send a request and read, to say why a server closed the
    connection: the TLS error or alert it answered with, CLOSED if it closed without a
    word right after the handshake (a TLS 1.3 server refusing a client certificate, or
    its absence, after the client has finished: asyncio servers send no alert), None if
    it answers. Blocking: run it in a thread."""
    request = f"HEAD / HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n"
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=server_name) as sock,
        ):
            sock.sendall(request.encode())
            return None if sock.recv(1) else CLOSED
    except ssl.SSLError as exc:
        return exc
    except ConnectionResetError:
        return CLOSED
    except OSError:
        return None


_UNKNOWN_CA = (2, 18, 19, 20, 21, 27)  # X509_V_ERR_*: no trusted issuer in the chain


def describe_failure(
    exc: ssl.SSLError,
    *,
    tls: TlsOptions | None,
    server_name: str,
    peer: str = "server",
    cert_keys: str = "tls_cert and tls_key",
    plain: str = "redis://",
) -> str:
    """One line saying which side's certificate failed and why: expired, wrong name,
    unknown CA, no client certificate, not a TLS port. `peer` names the other side
    ("server", "agent"), `cert_keys` the keys that give our client certificate, `plain`
    the scheme without TLS."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        code, message = exc.verify_code, exc.verify_message or str(exc)
        if code == 10:
            return f"TLS: the {peer}'s certificate has expired"
        if code == 9:
            return f"TLS: the {peer}'s certificate is not valid yet"
        if code == 62 or "hostname mismatch" in message.lower() or "IP address mismatch" in message:
            return (
                f"TLS: the {peer}'s certificate is not valid for {server_name!r} "
                "(wrong name; set tls_server_name to a name it holds)"
            )
        if code in _UNKNOWN_CA:
            ca = tls.ca if tls else None
            trusted = f"the CA in {ca}" if ca else "the system's CAs (set tls_ca)"
            return f"TLS: the {peer}'s certificate is signed by an unknown CA (not {trusted})"
        return f"TLS: the {peer}'s certificate was refused: {message}"
    has_cert = tls is not None and tls.cert is not None
    reason = (exc.reason or str(exc)).upper()
    if "CERTIFICATE_REQUIRED" in reason or (
        not has_cert and "ALERT" in reason and "HANDSHAKE_FAILURE" in reason
    ):
        return f"TLS: the {peer} requires a client certificate (set {cert_keys})"
    if isinstance(exc, ssl.SSLEOFError) or "EOF OCCURRED" in reason:
        why = (
            "it may have refused our client certificate"
            if has_cert
            else f"does it require a client certificate? set {cert_keys}"
        )
        return f"TLS: the {peer} closed the connection during the handshake ({why})"
    if "ALERT" in reason:
        alert = reason.split("ALERT_", 1)[-1].replace("_", " ").lower()
        return f"TLS: the {peer} refused our client certificate ({alert})"
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER_FAILURE" in reason:
        return f"TLS handshake failed: the port does not speak TLS (use {plain}?)"
    if "UNSUPPORTED_PROTOCOL" in reason or "VERSION" in reason:
        return f"TLS handshake failed: no common TLS version ({exc.reason})"
    return f"TLS handshake failed: {exc.reason or exc}"
