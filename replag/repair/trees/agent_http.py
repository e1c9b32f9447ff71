"""The coordinator's HTTP(S) link to one region agent: token, TLS, who is asking, failures.

`AgentLink` sends a request to an agent and hands back a 200 answer; every
failure becomes an `AgentError` naming the agent: unreachable or dead
(refused, reset, timed out), token refused (401/403), tree not current (503),
and a TLS handshake that fails (`AgentTlsError`: the agent's certificate
expired, names another host or is signed by a CA we do not trust, or the agent
wants a client certificate we did not give or does not trust ours). An
https:// agent's context comes from `replag.wire.tls`, like a Redis endpoint's.

With every request go the bearer token and, for the agent's audit log, what
the coordinator is running (`X-Replag-Run`, `X-Replag-Job`, `X-Replag-Started-By`:
the run id, the API job id, the name of the token that started it).
"""

from __future__ import annotations

import asyncio
import errno
import json
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from replag.errors import AgentError, AgentTlsError
from replag.topology import TlsOptions
from replag.wire import reply_limits
from replag.wire.tls import (
    CLOSED,
    TlsFilesError,
    client_context,
    describe_failure,
    refusal_after_handshake,
    tls_cause,
)

if TYPE_CHECKING:
    import aiohttp

PREFIX = "/agent/v1"
RUN_HEADER = "X-Replag-Run"
JOB_HEADER = "X-Replag-Job"
STARTED_BY_HEADER = "X-Replag-Started-By"
# What the agent keys are called where a client certificate is missing or refused.
CLIENT_CERT_KEYS = "the agent's tls_cert and tls_key, or settings.agent_tls_client_cert/_key"


def run_headers(run_id: str | None, started_by: Mapping[str, str] | None) -> dict[str, str]:
    """The headers that tell an agent's audit log which run (and job, and token) it serves."""
    out: dict[str, str] = {}
    if run_id:
        out[RUN_HEADER] = run_id
    if started_by:
        if started_by.get("job_id"):
            out[JOB_HEADER] = started_by["job_id"]
        if started_by.get("token"):
            out[STARTED_BY_HEADER] = started_by["token"]
    return out


class AgentLink:
    """HTTP client of the agent at `url` (http:// or https://), with the bearer token."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        timeout_s: float,
        tls: TlsOptions | None = None,
        headers: Mapping[str, str] | None = None,
        max_bytes: int = reply_limits.DEFAULT.max_bytes,
    ) -> None:
        self.url = url.rstrip("/")
        self.max_bytes = max_bytes  # of one answer (the region's max_reply_bytes)
        self.timeout_s = timeout_s
        self.tls = tls if self.url.startswith("https://") else None
        self._token = token
        self._headers = dict(headers or {})
        self._session: aiohttp.ClientSession | None = None
        self.bytes_received = 0
        self.bytes_sent = 0
        self.requests = 0
        self._by_replica: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _context(self) -> ssl.SSLContext | bool:
        if not self.url.startswith("https://"):
            return True  # aiohttp's default: unused on http://
        try:
            return client_context(self.tls or TlsOptions())
        except TlsFilesError as exc:  # a file, or our certificate expired: exit 2 too
            raise AgentTlsError(f"TLS: {exc}", where=self.url) from None

    def _server_name(self) -> str:
        from urllib.parse import urlsplit

        return (self.tls.server_name if self.tls else None) or urlsplit(self.url).hostname or ""

    def _open(self) -> aiohttp.ClientSession:
        # aiohttp loads when an agent is first asked (a check without agents never does:
        # its import costs a check ~0.2 s of CPU).
        import aiohttp

        if self._session is None:
            headers = dict(self._headers)
            if self._token:
                headers["Authorization"] = f"Bearer {self._token}"
            connector = aiohttp.TCPConnector(ssl=self._context())
            self._session = aiohttp.ClientSession(headers=headers, connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def take_bytes(self, replica: str) -> int:
        """Bytes received for `replica`'s calls since the last take."""
        return self._by_replica.pop(replica, 0)

    async def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        wait_s: float = 0.0,
        replica: str | None = None,
    ) -> tuple[bytes, Mapping[str, str]]:
        """(body, headers) of a 200 answer; AgentError otherwise."""
        import aiohttp
        from multidict import CIMultiDict

        session = self._open()
        url = f"{self.url}{PREFIX}{path}"
        payload = json.dumps(body).encode() if body is not None else None
        # A deadline for the whole exchange (not each read: an agent, or something in its
        # place, dripping a byte at a time fails as surely as one that stalls), with room
        # for the wait asked and for a large answer over a slow link.
        timeout = aiohttp.ClientTimeout(
            total=self.timeout_s + wait_s + 30.0, connect=self.timeout_s
        )
        self.requests += 1
        try:
            async with session.request(
                method,
                url,
                data=payload,
                headers={"Content-Type": "application/json"} if payload is not None else None,
                timeout=timeout,
                server_hostname=self._server_name() if self.tls else None,
                # An agent never redirects: one that does would have the request (key
                # names, a value's DUMP) sent to wherever it points.
                allow_redirects=False,
            ) as resp:
                data = await self._body(resp)
                self.bytes_sent += len(payload or b"") + len(path) + 200  # request line, headers
                received = len(data) + sum(len(k) + len(v) + 4 for k, v in resp.raw_headers)
                self.bytes_received += received
                if replica is not None:
                    self._by_replica[replica] = self._by_replica.get(replica, 0) + received
                if resp.status != 200:
                    raise self._refused(resp.status, data)
                return data, CIMultiDict(resp.headers)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise await self._failed(exc) from None

    async def _body(self, resp: aiohttp.ClientResponse) -> bytes:
        """The answer's body, refused unread beyond max_reply_bytes (whatever it announces)."""
        limit = self.max_bytes
        if resp.content_length is not None and resp.content_length > limit:
            raise AgentError(
                self._too_big(f"announced {resp.content_length} bytes"), where=self.url
            )
        chunks, size = [], 0
        async for chunk in resp.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > limit:
                raise AgentError(self._too_big(f"sent over {size} bytes"), where=self.url)
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_big(self, said: str) -> str:
        limit = reply_limits.size_text(self.max_bytes)
        return f"the agent's answer {said}, over max_reply_bytes = {limit}"

    async def _failed(self, exc: BaseException) -> AgentError:
        import aiohttp

        failure: ssl.SSLError | str | None = None
        if self.url.startswith("https://"):
            failure = tls_cause(exc)
            closed = isinstance(exc, aiohttp.ServerDisconnectedError | ConnectionResetError) or (
                isinstance(exc, aiohttp.ClientOSError) and exc.errno == errno.ECONNRESET
            )
            if failure is None and closed:
                failure = await self._refusal()
        if failure == CLOSED:
            has_cert = self.tls is not None and self.tls.cert is not None
            text = (
                "TLS: the agent closed the connection after the handshake: it refused our "
                "client certificate (signed by a CA its agent_tls_client_ca does not hold?)"
                if has_cert
                else f"TLS: the agent requires a client certificate (set {CLIENT_CERT_KEYS})"
            )
            return AgentTlsError(text, where=self.url)
        if isinstance(failure, ssl.SSLError):
            text = describe_failure(
                failure,
                tls=self.tls,
                server_name=self._server_name(),
                peer="agent",
                cert_keys=CLIENT_CERT_KEYS,
                plain="http://",
            )
            return AgentTlsError(text, where=self.url)
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError | asyncio.TimeoutError):
            reason = "timed out"
        return AgentError(f"agent unreachable: {reason}", where=self.url)

    async def _refusal(self) -> ssl.SSLError | str | None:
        """Why an https:// agent closed the connection, if it refused our certificate."""
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        context = self._context()
        if parts.hostname is None or not isinstance(context, ssl.SSLContext):
            return None
        return await asyncio.to_thread(
            refusal_after_handshake,
            parts.hostname,
            parts.port or 443,
            context,
            self._server_name(),
            timeout_s=self.timeout_s,
        )

    def _refused(self, status: int, data: bytes) -> AgentError:
        try:
            detail = str(json.loads(data).get("detail", data[:200]))
        except (ValueError, AttributeError):
            detail = data[:200].decode("utf-8", "replace")
        if status in (401, 403):
            hint = "" if self._token else " (no token to present: set settings.agent_token)"
            return AgentError(f"agent refused our token ({status}): {detail}{hint}", where=self.url)
        if status == 503:
            return AgentError(f"agent has no current tree: {detail}", where=self.url)
        if 300 <= status < 400:
            return AgentError(
                f"agent answered {status}, a redirect: not followed (an agent never "
                "redirects; is its url an agent's?)",
                where=self.url,
            )
        return AgentError(f"agent answered {status}: {detail}", where=self.url)
