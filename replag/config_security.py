"""The config file's security keys: TLS and credentials of endpoints, and API tokens.

An endpoint (or Sentinel) table may carry `tls_ca`, `tls_cert`, `tls_key`,
`tls_server_name`, `tls_verify`, `tls_min_version`, `username`, `password_env`
and `password_file`; whatever it leaves out comes from the file-wide settings
of the same names (`EndpointDefaults`), and what a URL's query says
(`?tls_ca=…`) comes last. `[[api_tokens]]` declares named bearer tokens with
scopes, each read from an environment variable or a file (a mounted secret).
Secrets are read here, once, when the file is loaded; errors name the key and
the file or variable, never what it holds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from replag.errors import ConfigError
from replag.settings import Settings
from replag.tokens import MIN_LENGTH, ApiToken
from replag.topology import Endpoint, TlsOptions, TlsVerify, Topology, tls_from_query
from replag.validation import AtKey, EnvVar, FileTable, NonEmptyStr


def read_secret_file(path: str) -> str:
    """The secret in `path` (one trailing newline dropped); ValueError naming the file
    and what is wrong with it, never its content."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ValueError(f"cannot read secret file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"secret file {path} is not UTF-8 text") from None
    secret = text[:-1] if text.endswith("\n") else text
    secret = secret[:-1] if secret.endswith("\r") else secret
    if not secret:
        raise ValueError(f"secret file {path} is empty")
    return secret


class SecretFile(str):
    """The path of a file holding a secret; it must be readable and not empty."""

    secret: str

    @classmethod
    def parse(cls, value: Any) -> SecretFile:
        if not isinstance(value, str) or not value:
            raise ValueError("expected the path of a file holding a secret")
        path = cls(value)
        path.secret = read_secret_file(value)
        return path


class TlsPath(str):
    """A CA, certificate or key file (a CA may be a directory); it must exist."""

    @classmethod
    def parse(cls, value: Any) -> TlsPath:
        if not isinstance(value, str) or not value:
            raise ValueError("expected a file path")
        if not os.path.exists(os.path.expanduser(value)):
            raise ValueError(f"no such file: {value}")
        return cls(os.path.expanduser(value))


@dataclass(frozen=True, kw_only=True)
class EndpointDefaults:
    """What every endpoint leaves unsaid comes from here (the file-wide settings)."""

    tls: TlsOptions = field(default_factory=TlsOptions)
    # What the coordinator verifies https:// agents with and presents to them.
    agent_tls: TlsOptions = field(default_factory=TlsOptions)
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, settings: Settings, environ: Mapping[str, str], *, where: str) -> EndpointDefaults:
        """From `settings`; ConfigError when a password variable or file cannot be read."""
        files = ("tls_ca", "tls_cert", "tls_key", "agent_tls_ca", "agent_tls_client_cert",
                 "agent_tls_client_key")  # fmt: skip
        for name in files:
            path = getattr(settings, name)
            if path is not None and not os.path.exists(os.path.expanduser(path)):
                raise ConfigError(f"no such file: {path}", where=f"{where}: settings.{name}")
        for cert, key in (
            ("tls_cert", "tls_key"),
            ("agent_tls_client_cert", "agent_tls_client_key"),
        ):
            if getattr(settings, key) is not None and getattr(settings, cert) is None:
                raise ConfigError(f"{key} is set without {cert}", where=f"{where}: settings")
        if settings.password_env is not None and settings.password_file is not None:
            raise ConfigError(
                "password_env and password_file both set: choose one", where=f"{where}: settings"
            )
        password = None
        if settings.password_env is not None:
            if settings.password_env not in environ:
                raise ConfigError(
                    f"environment variable {settings.password_env} is not set",
                    where=f"{where}: settings.password_env",
                )
            password = environ[settings.password_env]
        if settings.password_file is not None:
            try:
                password = read_secret_file(settings.password_file)
            except ValueError as exc:
                raise ConfigError(str(exc), where=f"{where}: settings.password_file") from None
        verify: TlsVerify = settings.tls_verify  # type: ignore[assignment]  # a choice
        tls = TlsOptions(
            ca=_expand(settings.tls_ca),
            cert=_expand(settings.tls_cert),
            key=_expand(settings.tls_key),
            server_name=settings.tls_server_name,
            verify=verify,
            min_version="1.3" if settings.tls_min_version == "1.3" else "1.2",
        )
        agent_tls = TlsOptions(
            ca=_expand(settings.agent_tls_ca),
            cert=_expand(settings.agent_tls_client_cert),
            key=_expand(settings.agent_tls_client_key),
        )
        return cls(tls=tls, agent_tls=agent_tls, username=settings.username, password=password)


def _expand(path: str | None) -> str | None:
    return os.path.expanduser(path) if path else path


class TlsKeys(FileTable, frozen=True, kw_only=True):
    """The TLS keys of an endpoint, Sentinel or region agent table."""

    tls_ca: TlsPath | None = None
    tls_cert: TlsPath | None = None
    tls_key: TlsPath | None = None
    tls_server_name: NonEmptyStr | None = None
    tls_verify: TlsVerify | None = None
    tls_min_version: Literal["1.2", "1.3"] | None = None

    def check_tls(self, *, tls: bool, plain: str = "redis://", secure: str = "rediss://") -> None:
        """AtKey for TLS keys that contradict each other or the URL's scheme (`tls`)."""
        if self.tls_key is not None and self.tls_cert is None:
            raise AtKey(("tls_key",), "tls_key is set without tls_cert")
        if not tls and self.tls_keys():
            first = next(iter(self.tls_keys()))
            raise AtKey((f"tls_{first}",), f"TLS keys on a {plain} URL (use {secure})")

    def tls_keys(self) -> dict[str, str]:
        keys = {
            "ca": self.tls_ca,
            "cert": self.tls_cert,
            "key": self.tls_key,
            "server_name": self.tls_server_name,
            "verify": self.tls_verify,
            "min_version": self.tls_min_version,
        }
        return {k: str(v) for k, v in keys.items() if v is not None}

    def tls_options(self, base: TlsOptions) -> TlsOptions:
        """`base` (the file-wide options) with this table's keys."""
        return replace(base, **self.tls_keys())  # type: ignore[arg-type]


class AccessKeys(TlsKeys, frozen=True, kw_only=True):
    """Keys shared by endpoint and Sentinel tables: TLS and credentials."""

    username: NonEmptyStr | None = None
    password_env: EnvVar | None = None
    password_file: SecretFile | None = None

    def check_access(self, *, tls: bool) -> None:
        """AtKey for keys that contradict each other or the URL's scheme (`tls`: rediss)."""
        if self.password_env is not None and self.password_file is not None:
            raise AtKey(("password_file",), "password_env and password_file both set: choose one")
        self.check_tls(tls=tls)

    def apply(
        self,
        ep: Endpoint,
        *,
        url: str,
        defaults: EndpointDefaults,
        environ: Mapping[str, str],
        use_defaults: bool = True,
    ) -> Endpoint:
        """`ep` (parsed from `url`) with this table's keys, then `defaults` where neither
        the table nor the URL says (credentials only where `use_defaults`)."""
        if ep.tls is not None:
            base = self.tls_options(defaults.tls)
            ep = replace(ep, tls=tls_from_query(urlsplit(url).query, tls=base, url=url))
        username = self.username or ep.username
        password = ep.password
        if self.password_env is not None:
            password = environ[self.password_env]
        elif self.password_file is not None:
            password = self.password_file.secret
        if use_defaults:
            username = username or defaults.username
            password = password if password is not None else defaults.password
        return replace(ep, username=username, password=password)

    @staticmethod
    def written(ep: Endpoint) -> dict[str, Any]:
        """The keys a file writes for `ep`'s TLS options (those not left at the default)."""
        if ep.tls is None:
            return {}
        return {f"tls_{name}": value for name, value in ep.tls.changed().items()}


class ApiTokenTable(FileTable, frozen=True, kw_only=True):
    """`[[api_tokens]]`: `name`, `scopes` (read, check, repair), and `token_env` or
    `token_file`."""

    noun: ClassVar[str] = "API token"
    name: NonEmptyStr
    scopes: list[Literal["read", "check", "repair"]]
    token_env: EnvVar | None = None
    token_file: SecretFile | None = None

    def __post_init__(self) -> None:
        if not self.scopes:
            raise AtKey(("scopes",), "name at least one scope: read, check or repair")
        if (self.token_env is None) == (self.token_file is None):
            raise ValueError("give the token's token_env or its token_file (one of them)")

    def token(self, environ: Mapping[str, str], *, where: str) -> ApiToken:
        key = "token_env" if self.token_env is not None else "token_file"
        secret = environ[self.token_env] if self.token_env else self.token_file.secret  # type: ignore[union-attr]
        if len(secret) < MIN_LENGTH:
            raise ConfigError(
                f"token {self.name!r} is shorter than {MIN_LENGTH} characters",
                where=f"{where}.{key}",
            )
        return ApiToken(name=self.name, scopes=frozenset(self.scopes), secret=secret)


def api_tokens(
    tables: list[ApiTokenTable], environ: Mapping[str, str], *, where: str
) -> tuple[ApiToken, ...]:
    """The named tokens; ConfigError for a repeated name or secret."""
    tokens: list[ApiToken] = []
    for i, table in enumerate(tables):
        token = table.token(environ, where=f"{where}: api_tokens[{i}]")
        for other in tokens:
            if other.name == token.name:
                raise ConfigError(f"duplicate token name {token.name!r}",
                                  where=f"{where}: api_tokens[{i}].name")  # fmt: skip
            if other.secret == token.secret:
                raise ConfigError(f"token {token.name!r} has the same secret as {other.name!r}",
                                  where=f"{where}: api_tokens[{i}]")  # fmt: skip
        tokens.append(token)
    return tuple(tokens)


# --- discovery: references to secrets, never the secrets ----------------------


def seed_url(url: str, *, password: str | None, tls: TlsOptions) -> str:
    """`url` with `password` (from --password-env: never on the command line) and, for
    rediss://, the file-wide TLS options it does not set itself; for this process only,
    never printed (errors show URLs redacted)."""
    from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    netloc = parts.netloc
    if password is not None:
        user = quote(parts.username or "", safe="")
        host = netloc.rsplit("@", 1)[-1]
        netloc = f"{user}:{quote(password, safe='')}@{host}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    if parts.scheme == "rediss":
        given = {name for name, _ in query}
        for name, value in tls.changed().items():
            if f"tls_{name}" not in given:
                query.append((f"tls_{name}", value))
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))


def as_references(
    topology: Topology, *, password: str | None, password_env: str | None
) -> tuple[Topology, dict[str, Any]]:
    """`topology` as a file should hold it: the password given by --password-env written
    as `password_env = NAME` in [settings] (never the password), and TLS options every
    endpoint shares written once as [settings] tls_* instead of on each endpoint."""
    settings: dict[str, Any] = {}
    endpoints = topology.endpoints()

    def stripped(ep: Endpoint) -> Endpoint:
        if password is not None and ep.password == password:
            ep = replace(ep, password=None)
        if shared is not None and ep.tls is not None:
            ep = replace(ep, tls=TlsOptions())
        return ep

    options = {ep.tls for ep in endpoints if ep.tls is not None}
    shared = next(iter(options)) if len(options) == 1 else None
    if shared is not None:
        settings |= {f"tls_{name}": value for name, value in shared.changed().items()}
    if password_env is not None:
        settings["password_env"] = password_env
    regions = tuple(
        replace(
            r,
            write=stripped(r.write) if r.write else None,
            replicas=tuple(stripped(ep) for ep in r.replicas),
        )
        for r in topology.regions
    )
    groups = tuple(
        replace(g, members=tuple(stripped(m) for m in g.members)) for g in topology.groups
    )
    return replace(topology, regions=regions, groups=groups), settings
