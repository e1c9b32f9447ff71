"""Who is calling the API: the bearer token presented, matched against the named tokens.

`caller_with(scope)` is a route dependency: it answers 401 (no or unknown token),
403 (no token configured at all, or one lacking `scope`) or hands the route a
`Caller`, the token's name and the client's address, which a data-changing
route logs and stores with what it starts. Reads need a token only when
`settings.api_reads` is `token`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from replag.service import ReplagService
from replag.tokens import ApiToken, Scope, match

audit = logging.getLogger("replag.audit")
_bearer = HTTPBearer(
    auto_error=False, description="a token of [[api_tokens]] or settings.api_token"
)
NO_TOKEN_CONFIGURED = (
    "data-changing calls are disabled: this server has no api_token configured "
    "(set settings.api_token or REPLAG_API_TOKEN, or declare [[api_tokens]])"
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


@dataclass(frozen=True, kw_only=True)
class Caller:
    """The token a request came with and where it came from."""

    token: ApiToken
    client: str

    @property
    def name(self) -> str:
        return self.token.name

    def require(self, scope: Scope, request: Request) -> None:
        """403 unless the token has `scope` (the refusal is logged)."""
        if self.token.allows(scope):
            return
        audit.warning("%s %s from %s: token %r lacks the %s scope", request.method,
                      request.url.path, self.client, self.name, scope)  # fmt: skip
        scopes = ", ".join(sorted(self.token.scopes))
        raise HTTPException(403, f"token {self.name!r} lacks the {scope} scope (it has {scopes})")

    def started_by(self, job_id: str) -> dict[str, str]:
        """What is stored with a run this caller started (never the secret)."""
        return {"token": self.name, "client": self.client, "job_id": job_id}


def client_address(request: Request) -> str:
    if request.client is None:
        return "unknown"
    host, port = request.client
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _authenticate(
    svc: ReplagService, request: Request, credentials: HTTPAuthorizationCredentials | None,
    scope: Scope,
) -> Caller:  # fmt: skip
    tokens = svc.config.api_tokens
    if not tokens:
        raise HTTPException(403, NO_TOKEN_CONFIGURED)
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(
            401,
            "missing bearer token (Authorization: Bearer …)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    token = match(tokens, credentials.credentials)
    client = client_address(request)
    if token is None:
        audit.warning("%s %s from %s: wrong bearer token", request.method, request.url.path,
                      client)  # fmt: skip
        raise HTTPException(401, "wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
    caller = Caller(token=token, client=client)
    caller.require(scope, request)
    return caller


async def _service(request: Request) -> ReplagService:
    svc: ReplagService = request.app.state.service
    return svc


def caller_with(scope: Scope) -> Callable[..., Awaitable[Caller]]:
    """A dependency: the Caller, if its token has `scope` (else 401/403)."""

    async def dependency(
        request: Request,
        svc: Annotated[ReplagService, Depends(_service)],
        credentials: Credentials,
    ) -> Caller:
        return _authenticate(svc, request, credentials, scope)

    return dependency


async def reader(request: Request, svc: Annotated[ReplagService, Depends(_service)]) -> None:
    """Reads: open unless `settings.api_reads` is `token`, then any token may read. The
    header is read here, not declared: the OpenAPI document says reads need no token
    because by default they do not."""
    if svc.settings.api_reads == "token":
        _authenticate(svc, request, await _bearer(request), "read")


def log_change(caller: Caller, what: str, **details: Any) -> None:
    """One audit line for a data-changing request: what, the token's name, the client."""
    extra = " ".join(f"{k}={v}" for k, v in details.items() if v is not None)
    audit.info("%s by token %r from %s %s", what, caller.name, caller.client, extra)


async def refusal(request: Request, svc: ReplagService, scope: Scope) -> HTTPException | None:
    """The 401/403 this request would get for `scope`, None if its token has it: for
    answers given before the route's own dependencies run (a body that is not JSON)."""
    try:
        _authenticate(svc, request, await _bearer(request), scope)
    except HTTPException as exc:
        return exc
    return None
