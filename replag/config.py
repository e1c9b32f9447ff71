"""Loading, validating and writing the one TOML file replag reads.

    [settings]                # optional; see replag.settings for every key
    timeout = "5s"

    [[regions]]
    name = "us-east"
    write = "redis://127.0.0.1:7000"          # primary or Dynomite client port
    replicas = ["redis://10.0.0.2:6379", { name = "use-2", url = "redis://…", rack = "r2" }]
    # `local`: the address inside the region (a region's agent uses it), when the URL
    # is how the prober reaches the server from elsewhere: { url = "…", local = "redis://…" }

    [[groups]]                # replica groups compared by `repair`
    name = "main"
    members = ["use-2", "redis://10.1.0.2:6379"]   # endpoint names or URLs

Every error names the file and the key (and the line for TOML syntax errors).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replag.alerts.config import AlertsConfig
from replag.errors import ConfigError
from replag.private_files import write_private
from replag.settings import Settings, resolve_settings
from replag.tokens import ApiToken, all_tokens
from replag.topology import Topology
from replag.wire import reply_limits


@dataclass(frozen=True, kw_only=True)
class Config:
    path: Path | None
    settings: Settings
    topology: Topology
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    # Named [[api_tokens]], then settings.api_token as a full-scope token named api_token.
    api_tokens: tuple[ApiToken, ...] = ()

    def __post_init__(self) -> None:
        if not self.api_tokens and self.settings.api_token:
            object.__setattr__(self, "api_tokens", all_tokens((), self.settings.api_token))

    def agent_token(self) -> str | None:
        """The secret the coordinator presents to region agents: the token named by
        settings.agent_token, else settings.api_token."""
        name = self.settings.agent_token
        if name is None:
            return self.settings.api_token
        for token in self.api_tokens:
            if token.name == name:
                return token.secret
        return None  # refused when the file is loaded (config_from_dict)


def load_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate `path`; raise ConfigError naming the file and key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("no such file", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", where=str(path)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message ends with "(at line L, column C)".
        raise ConfigError(f"invalid TOML: {exc}", where=str(path)) from None
    return config_from_dict(data, where=str(path), path=path, environ=environ)


def config_from_dict(
    data: Mapping[str, Any],
    *,
    where: str,
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """A Config from a file's parsed tables (`where` names the file in errors)."""
    # The tables (and msgspec) load when a file is read, not with replag: `--help` stays light.
    from replag.config_security import EndpointDefaults, api_tokens
    from replag.config_tables import ConfigFile
    from replag.validation import validate

    environ = os.environ if environ is None else environ
    # [settings] first, as ever: a bad setting is reported before what it may explain.
    table = data.get("settings", {})
    settings = resolve_settings(
        table if isinstance(table, Mapping) else {}, where=where, environ=environ
    )
    defaults = EndpointDefaults.of(settings, environ, where=where)
    file = validate(ConfigFile, data, where=where, environ=environ)
    named = api_tokens(file.api_tokens, environ, where=where)
    tokens = all_tokens(named, settings.api_token)
    if settings.agent_token is not None and settings.agent_token not in {t.name for t in tokens}:
        declared = ", ".join(t.name for t in tokens) or "none"
        raise ConfigError(
            f"no token named {settings.agent_token!r} (declared: {declared})",
            where=f"{where}: settings.agent_token",
        )
    return Config(
        path=path,
        settings=settings,
        topology=dataclasses.replace(
            file.topology(environ, defaults).with_limits(reply_limits.from_settings(settings)),
            allow_networks=settings.allow_networks,
        ),
        alerts=file.alerts.alerts(environ),
        api_tokens=tokens,
    )


# --- writing ---------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def render_config(
    topology: Topology,
    *,
    settings: Mapping[str, Any] | None = None,
    header: str = "",
    comments: Mapping[str, str] | None = None,
    redact: bool = False,
    endpoint_comments: Mapping[str, str] | None = None,
) -> str:
    """TOML text for `topology` that `load_config` reads back to the same topology.

    `comments` maps a region or group name to a comment written above it, and
    `endpoint_comments` an endpoint name to one written above that endpoint
    (discovery says where each entry came from; a comment may span lines).
    Passwords are written as given unless `redact`; files holding them should
    be mode 0600.
    """
    from replag.config_tables import GroupTable, RegionTable
    from replag.validation import FileTable, as_written

    comments = comments or {}
    lines = _comment(header)
    if settings:
        lines += ["", "[settings]"] + [f"{k} = {_toml_value(v)}" for k, v in settings.items()]
    declared = {ep.name for r in topology.regions for ep in (r.write, *r.replicas) if ep}
    tables: list[tuple[str, str, FileTable]] = [
        ("regions", r.name, RegionTable.of(r, redact=redact)) for r in topology.regions
    ]
    tables += [
        ("groups", g.name, GroupTable.of(g, declared=declared, redact=redact))
        for g in topology.groups
    ]
    for array, name, table in tables:
        lines += ["", *_comment(comments.get(name, "")), f"[[{array}]]"]
        for key, value in as_written(table).items():
            lines += _assignment(key, value, endpoint_comments or {})
    return "\n".join(lines).lstrip("\n") + "\n"


def _assignment(key: str, value: Any, endpoint_comments: Mapping[str, str]) -> list[str]:
    """`key = value`; an array of tables one per line, each endpoint under its comment."""

    def comment_of(item: Any) -> list[str]:
        name = item.get("name", "") if isinstance(item, dict) else ""
        return _comment(endpoint_comments.get(name, ""))

    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        lines = [f"{key} = ["]
        for item in value:
            lines += [*(f"  {line}" for line in comment_of(item)), f"  {_toml_value(item)},"]
        return [*lines, "]"]
    return [*comment_of(value), f"{key} = {_toml_value(value)}"]


def _comment(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.splitlines()]


def write_config_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, mode 0600, so nothing is half-written."""
    write_private(path, text.encode("utf-8"))
