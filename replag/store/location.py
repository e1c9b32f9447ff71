"""Where the store is: a SQLite file (a path, or `sqlite:///path`) or a PostgreSQL URL.

`postgresql://user@host:port/db?sslmode=verify-full&sslrootcert=ca.pem`: TLS
and other libpq options are URL parameters. The password comes, in this order,
from the URL (discouraged: it shows in process lists), `REPLAG_STORE_PASSWORD`,
the file named by `REPLAG_STORE_PASSWORD_FILE`, or libpq's own `PGPASSWORD` /
`~/.pgpass`. A location is never shown with its password.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from replag.errors import ConfigError

PASSWORD_ENV = "REPLAG_STORE_PASSWORD"
PASSWORD_FILE_ENV = "REPLAG_STORE_PASSWORD_FILE"
_POSTGRES_SCHEMES = ("postgresql", "postgres")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# `postgresql:/db`, `postgres:db`: a scheme with its slashes mistyped, not a file name.
_SCHEME_LIKE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(?!//)")


@dataclass(frozen=True)
class StoreLocation:
    """A parsed `settings.store`: `target` is the file path or the URL as given."""

    backend: Literal["sqlite", "postgresql"]
    target: str

    @property
    def shown(self) -> str:
        """The location with any password replaced by ***, safe for logs and messages."""
        return redact(self.target) if self.backend == "postgresql" else self.target


def parse_location(value: str | Path) -> StoreLocation:
    """A store location, or ConfigError for a scheme replag has no store for."""
    text = str(value)
    match = _SCHEME.match(text)
    if match is None:
        typo = _SCHEME_LIKE.match(text)
        if typo is not None:
            raise ConfigError(
                f"{redact(text)}: looks like a URL without '//' after {typo.group(1)}: "
                "(a SQLite path, sqlite:///path, or postgresql://user@host:port/db)"
            )
        return StoreLocation("sqlite", text)
    scheme = match.group(1).lower()
    if scheme in _POSTGRES_SCHEMES:
        parts = urlsplit(text)
        if not parts.path.strip("/"):
            raise ConfigError(
                f"{redact(text)}: name the database (postgresql://user@host:port/DATABASE)"
            )
        return StoreLocation("postgresql", text)
    if scheme == "sqlite":
        path = text[len("sqlite://") :]
        if not path:
            raise ConfigError(f"{text}: name the file (sqlite:///path/to/replag.sqlite)")
        return StoreLocation("sqlite", path)
    raise ConfigError(
        f"{redact(text)}: unknown store scheme {scheme!r} "
        "(a SQLite path, sqlite:///path, or postgresql://user@host:port/db)"
    )


def redact(url: str) -> str:
    """`url` with the password (if any) as ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable store URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def store_password(environ: Mapping[str, str] | None = None) -> str | None:
    """The PostgreSQL password from the environment or its file (None: libpq's own ways)."""
    environ = os.environ if environ is None else environ
    if environ.get(PASSWORD_ENV):
        return environ[PASSWORD_ENV]
    path = environ.get(PASSWORD_FILE_ENV)
    if not path:
        return None
    try:
        return Path(path).expanduser().read_text().strip("\r\n")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the store password file: {exc.strerror}", where=PASSWORD_FILE_ENV
        ) from None


STATE_DIR = Path("~/.local/state/replag")


def store_for_config(name: str, *, where: Path | None = None) -> Path:
    """A SQLite store of a config's own (`topology discover` writes it into the file): one
    file per config, named for it, so two configs never share lag windows, runs and
    alert state unless the user points them at one store on purpose. `where` (the
    config file's path) tells apart two files of the same name in different folders."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "replag"
    if where is not None:
        digest = hashlib.sha256(str(where.expanduser().resolve()).encode()).hexdigest()[:8]
        stem = f"{stem}-{digest}"
    return STATE_DIR / f"{stem}.sqlite"
