"""Who is calling an agent: the bearer token, its scopes, and the audit of what it changed.

An agent takes the service's tokens (`[[api_tokens]]`, and `settings.api_token` as
a token named api_token with every scope), with scopes by what a route lets a
caller do next to the data:

* `read`: `GET /agent/v1/replicas`, `/metrics`, the lag part's watches and clock
  (probe keys only: arrivals and clocks, no key of the data);
* `check`: tree nodes, leaf contents and key states (every key name, and values
  for a newest:FIELD policy): what a check walks;
* `repair`: a repair's read of a winner (under WATCH) and its compare-and-set write.

`caller_with(scope)` is a route dependency answering 401 (no or unknown token) or
403 (no token configured, or one lacking the scope; logged by `replag.audit`),
else handing the route a `Caller`: the token's name, the client's address, and
what the coordinator says it is running (`X-Replag-Run`, `-Job`, `-Started-By`).
Every write is logged by `replag.audit` with those and kept in the agent's
audit file (`AgentAudit`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from replag.private_files import open_private
from replag.repair.trees.agent_http import JOB_HEADER, RUN_HEADER, STARTED_BY_HEADER
from replag.tokens import ApiToken, Scope, match

if TYPE_CHECKING:
    from replag.agent.region import RegionAgent

audit = logging.getLogger("replag.audit")
log = logging.getLogger(__name__)
_bearer = HTTPBearer(
    auto_error=False, description="a token of [[api_tokens]] or settings.api_token"
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
NO_TOKEN_CONFIGURED = "this agent has no api_token or [[api_tokens]] configured"
# What a coordinator says it runs is shown in logs: short, and no line breaks or quotes.
_LABEL = re.compile(r"[^A-Za-z0-9._:@/+=-]")


def _label(value: str | None) -> str | None:
    return _LABEL.sub("?", value[:64]) if value else None


@dataclass(frozen=True, kw_only=True)
class Caller:
    """The token a request came with, where it came from, and the run it says it serves."""

    token: ApiToken
    client: str
    run: str | None = None
    job: str | None = None
    started_by: str | None = None

    @property
    def name(self) -> str:
        return self.token.name

    def to_dict(self) -> dict[str, str]:
        """What is kept with what this caller made the agent do (never the secret)."""
        out = {"token": self.name, "client": self.client}
        for key in ("run", "job", "started_by"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    def describe(self) -> str:
        """`by token 'x' from 10.0.0.1:4000 run=… job=… started_by=…`, for the audit log."""
        extra = "".join(
            f" {key}={getattr(self, key)}"
            for key in ("run", "job", "started_by")
            if getattr(self, key) is not None
        )
        return f"by token {self.name!r} from {self.client}{extra}"


def client_address(request: Request) -> str:
    if request.client is None:
        return "unknown"
    host, port = request.client
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _agent(request: Request) -> RegionAgent:
    agent: RegionAgent = request.app.state.agent
    return agent


def authenticate(
    agent: RegionAgent,
    request: Request,
    credentials: HTTPAuthorizationCredentials | None,
    scope: Scope,
) -> Caller:
    """The Caller, if its token has `scope`; HTTPException 401/403 otherwise (logged)."""
    tokens = agent.config.api_tokens
    if not tokens:  # `replag agent` refuses to start without one; a test app may not
        raise HTTPException(403, NO_TOKEN_CONFIGURED)
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(
            401, "missing bearer token (Authorization: Bearer …)", {"WWW-Authenticate": "Bearer"}
        )
    client = client_address(request)
    token = match(tokens, credentials.credentials)
    if token is None:
        audit.warning("%s %s from %s: wrong bearer token", request.method, request.url.path,
                      client)  # fmt: skip
        raise HTTPException(401, "wrong bearer token", {"WWW-Authenticate": "Bearer"})
    headers = request.headers
    caller = Caller(
        token=token,
        client=client,
        run=_label(headers.get(RUN_HEADER)),
        job=_label(headers.get(JOB_HEADER)),
        started_by=_label(headers.get(STARTED_BY_HEADER)),
    )
    if not token.allows(scope):
        audit.warning("%s %s %s: token lacks the %s scope", request.method, request.url.path,
                      caller.describe(), scope)  # fmt: skip
        scopes = ", ".join(sorted(token.scopes))
        raise HTTPException(403, f"token {token.name!r} lacks the {scope} scope (it has {scopes})")
    return caller


def caller_with(scope: Scope) -> Callable[..., Awaitable[Caller]]:
    """A dependency: the Caller, if its token has `scope` (else 401/403)."""

    async def dependency(request: Request, credentials: Credentials) -> Caller:
        return authenticate(_agent(request), request, credentials, scope)

    return dependency


# One dependency object per scope, so a route that also asks for the Caller does not
# authenticate twice (FastAPI runs a dependency once per request).
reader = caller_with("read")
checker = caller_with("check")
repairer = caller_with("repair")


class AgentAudit:
    """What callers made this agent change: one `replag.audit` line per write, and the
    same as a JSON line in `audit.jsonl` of the agent's state directory (kept over
    restarts; the file is moved to `audit.jsonl.1` past `max_bytes`)."""

    def __init__(self, state_dir: Path | None, *, max_bytes: int = 64 << 20) -> None:
        self.path = state_dir / "audit.jsonl" if state_dir is not None else None
        self.max_bytes = max_bytes
        self.writes = 0

    def write(self, caller: Caller, *, replica: str, key: bytes, op: str, outcome: str) -> None:
        self.writes += 1
        shown = key[:80].decode("utf-8", "backslashreplace") + ("…" if len(key) > 80 else "")
        audit.info("repair write of %r on %s (%s) %s: %s", shown, replica, op,
                   caller.describe(), outcome)  # fmt: skip
        self._keep({
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **caller.to_dict(),
            "replica": replica,
            "key": key.decode("utf-8", "backslashreplace"),
            "op": op,
            "outcome": outcome,
        })  # fmt: skip

    def _keep(self, row: dict[str, Any]) -> None:
        if self.path is None:
            return
        try:
            if self.path.exists() and self.path.stat().st_size > self.max_bytes:
                self.path.replace(self.path.with_name("audit.jsonl.1"))
            with open_private(self.path, "a") as out:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        except OSError as exc:  # the log line above still says what happened
            log.warning("cannot append to the audit file %s: %s", self.path, exc)
