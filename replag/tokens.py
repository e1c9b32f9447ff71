"""Named API tokens and what each may do: its scopes.

A token is declared in the config file (`[[api_tokens]]`: a name, scopes, and
where its secret is, an environment variable or a file such as a mounted
secret); the old single `settings.api_token` still works, as a token named
`api_token` with every scope. What a caller did is recorded under the token's
name, never its secret.

Scopes: `read` (the API's GET endpoints and /metrics, when `settings.api_reads`
is `token`), `check` (start a check: it reads every key, writes nothing) and
`repair` (start a repair, which checks first, so it includes `check`). Every
token may read.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Scope = Literal["read", "check", "repair"]
SCOPES: tuple[Scope, ...] = ("read", "check", "repair")
LEGACY_NAME = "api_token"
MIN_LENGTH = 16

# What each scope lets a token do besides itself.
_IMPLIES: dict[str, frozenset[str]] = {
    "read": frozenset({"read"}),
    "check": frozenset({"read", "check"}),
    "repair": frozenset({"read", "check", "repair"}),
}


@dataclass(frozen=True, kw_only=True)
class ApiToken:
    """One bearer token: its name (logged, stored with runs), scopes and secret."""

    name: str
    scopes: frozenset[str]
    secret: str = field(repr=False)

    def allows(self, scope: Scope) -> bool:
        return any(scope in _IMPLIES[s] for s in self.scopes)

    def to_dict(self) -> dict[str, object]:
        """Safe to show: the name and scopes, never the secret."""
        return {"name": self.name, "scopes": sorted(self.scopes)}


def all_tokens(named: Iterable[ApiToken], legacy: str | None) -> tuple[ApiToken, ...]:
    """The named tokens, and `settings.api_token` as a full-scope token if it is set."""
    tokens = list(named)
    if legacy:
        tokens.append(ApiToken(name=LEGACY_NAME, scopes=frozenset(SCOPES), secret=legacy))
    return tuple(tokens)


def match(tokens: Iterable[ApiToken], presented: str) -> ApiToken | None:
    """The token whose secret is `presented` (compared in constant time with each)."""
    found = None
    given = presented.encode()
    for token in tokens:
        # Every token is compared, so the time taken says nothing about which matched.
        if hmac.compare_digest(given, token.secret.encode()) and found is None:
            found = token
    return found
