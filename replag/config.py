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

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from replag.alerts.config import AlertsConfig, parse_alerts
from replag.errors import ConfigError
from replag.settings import Settings, resolve_settings
from replag.topology import (
    Endpoint,
    EndpointKind,
    Region,
    ReplicaGroup,
    SentinelRef,
    Topology,
)

_REGION_KEYS = {"name", "write", "write_kind", "replicas", "slots", "sentinel", "agent"}
_SENTINEL_KEYS = {"master", "sentinels", "password_env"}
_ENDPOINT_KEYS = {"name", "url", "kind", "rack", "password_env", "local"}
_GROUP_KEYS = {"name", "members", "slots"}


@dataclass(frozen=True, kw_only=True)
class Config:
    path: Path | None
    settings: Settings
    topology: Topology
    alerts: AlertsConfig = field(default_factory=AlertsConfig)


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
    environ = os.environ if environ is None else environ
    unknown = sorted(set(data) - {"settings", "regions", "groups", "alerts"})
    if unknown:
        raise ConfigError(
            f"unknown top-level key {unknown[0]!r} (expected settings, regions, groups, alerts)",
            where=where,
        )
    table = data.get("settings", {})
    if not isinstance(table, dict):
        raise ConfigError("[settings] must be a table", where=where)
    settings = resolve_settings(table, where=where, environ=environ)
    topology = _topology(data, where=where, environ=environ)
    alerts = parse_alerts(data.get("alerts", {}), where=where, environ=environ)
    return Config(path=path, settings=settings, topology=topology, alerts=alerts)


def _topology(data: Mapping[str, Any], *, where: str, environ: Mapping[str, str]) -> Topology:
    raw_regions = data.get("regions", [])
    if not isinstance(raw_regions, list) or not all(isinstance(r, dict) for r in raw_regions):
        raise ConfigError("`regions` must be an array of tables ([[regions]])", where=where)
    regions: list[Region] = []
    by_name: dict[str, Endpoint] = {}

    def remember(ep: Endpoint, key: str) -> None:
        if ep.name in by_name:
            raise ConfigError(f"duplicate endpoint name {ep.name!r}", where=f"{where}: {key}")
        by_name[ep.name] = ep

    for i, raw in enumerate(raw_regions):
        key = f"regions[{i}]"
        _no_unknown(raw, _REGION_KEYS, where=where, key=key)
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError("missing region name", where=f"{where}: {key}.name")
        if any(r.name == name for r in regions):
            raise ConfigError(f"duplicate region {name!r}", where=f"{where}: {key}.name")
        write_kind = raw.get("write_kind", "redis")
        if write_kind not in ("redis", "dynomite"):
            raise ConfigError(
                f"expected redis or dynomite, got {write_kind!r}",
                where=f"{where}: {key}.write_kind",
            )
        write = None
        if "write" in raw:
            write = _endpoint(
                raw["write"],
                where=where,
                key=f"{key}.write",
                default_name=f"{name}-write",
                region=name,
                kind=write_kind,
                environ=environ,
            )
            remember(write, f"{key}.write")
        raw_replicas = raw.get("replicas", [])
        if not isinstance(raw_replicas, list):
            raise ConfigError("`replicas` must be an array", where=f"{where}: {key}.replicas")
        replicas = []
        for j, raw_ep in enumerate(raw_replicas):
            ep = _endpoint(
                raw_ep,
                where=where,
                key=f"{key}.replicas[{j}]",
                default_name=f"{name}-{j + 1}",
                region=name,
                kind="redis",
                environ=environ,
            )
            remember(ep, f"{key}.replicas[{j}]")
            replicas.append(ep)
        if write is None and not replicas:
            raise ConfigError(
                "a region needs a write endpoint or replicas", where=f"{where}: {key}"
            )
        slots = _slots(raw.get("slots", []), where=f"{where}: {key}.slots")
        sentinel = None
        if "sentinel" in raw:
            sentinel = _sentinel(
                raw["sentinel"], where=where, key=f"{key}.sentinel", environ=environ
            )
            if write is not None and write.kind != "redis":
                raise ConfigError(
                    "a Sentinel master's write endpoint is a Redis primary, not a proxy port",
                    where=f"{where}: {key}.sentinel",
                )
            if write is not None and not sentinel.sentinels:
                raise ConfigError(
                    'list the Sentinels (sentinels = ["redis://host:26379", …]) to follow '
                    "the write endpoint through a failover",
                    where=f"{where}: {key}.sentinel.sentinels",
                )
        agent = raw.get("agent")
        if agent is not None and (
            not isinstance(agent, str) or not agent.startswith(("http://", "https://"))
        ):
            raise ConfigError(
                f"expected the agent's http:// or https:// URL, got {agent!r}",
                where=f"{where}: {key}.agent",
            )
        regions.append(
            Region(
                name=name,
                write=write,
                replicas=tuple(replicas),
                slots=slots,
                sentinel=sentinel,
                agent=agent.rstrip("/") if agent else None,
            )
        )

    raw_groups = data.get("groups", [])
    if not isinstance(raw_groups, list) or not all(isinstance(g, dict) for g in raw_groups):
        raise ConfigError("`groups` must be an array of tables ([[groups]])", where=where)
    groups: list[ReplicaGroup] = []
    for i, raw in enumerate(raw_groups):
        key = f"groups[{i}]"
        _no_unknown(raw, _GROUP_KEYS, where=where, key=key)
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError("missing group name", where=f"{where}: {key}.name")
        members_raw = raw.get("members")
        if not isinstance(members_raw, list) or len(members_raw) < 2:
            raise ConfigError("a group needs at least 2 members", where=f"{where}: {key}.members")
        members = []
        for j, member in enumerate(members_raw):
            mkey = f"{key}.members[{j}]"
            if isinstance(member, str) and member in by_name:
                members.append(by_name[member])
            elif isinstance(member, str) and "://" not in member:
                raise ConfigError(f"no endpoint named {member!r}", where=f"{where}: {mkey}")
            else:
                members.append(
                    _endpoint(
                        member,
                        where=where,
                        key=mkey,
                        default_name=f"{name}-{j + 1}",
                        region=None,
                        kind="redis",
                        environ=environ,
                    )
                )
        if any(m.kind != "redis" for m in members):
            raise ConfigError(
                "group members must be Redis servers, not proxy ports", where=f"{where}: {key}"
            )
        slots = _slots(raw.get("slots", []), where=f"{where}: {key}.slots")
        groups.append(ReplicaGroup(name=name, members=tuple(members), slots=slots))
    if not regions and not groups:
        raise ConfigError(
            "no [[regions]] and no [[groups]]: nothing to probe or repair", where=where
        )
    return Topology(regions=tuple(regions), groups=tuple(groups))


def _slots(raw: Any, *, where: str) -> tuple[tuple[int, int], ...]:
    if not isinstance(raw, list):
        raise ConfigError("`slots` must be an array of [start, end] pairs", where=where)
    out = []
    for pair in raw:
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(x, int) and 0 <= x < 16384 for x in pair)
            or pair[0] > pair[1]
        ):
            raise ConfigError(f"bad slot range {pair!r}", where=where)
        out.append((pair[0], pair[1]))
    return tuple(out)


def _sentinel(raw: Any, *, where: str, key: str, environ: Mapping[str, str]) -> SentinelRef:
    """`{ master = NAME, sentinels = ["redis://host:26379" | "host:26379", …], password_env }`."""
    if not isinstance(raw, dict):
        raise ConfigError(
            "expected a table { master = …, sentinels = […] }", where=f"{where}: {key}"
        )
    _no_unknown(raw, _SENTINEL_KEYS, where=where, key=key)
    master = raw.get("master")
    if not isinstance(master, str) or not master:
        raise ConfigError("missing Sentinel master name", where=f"{where}: {key}.master")
    urls = raw.get("sentinels", [])
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise ConfigError(
            "expected an array of Sentinel addresses", where=f"{where}: {key}.sentinels"
        )
    password_env = raw.get("password_env")
    if password_env is not None and password_env not in environ:
        raise ConfigError(
            f"environment variable {password_env} is not set", where=f"{where}: {key}.password_env"
        )
    sentinels = []
    for i, url in enumerate(urls):
        try:
            ep = sentinel_endpoint(url)
        except ValueError as exc:
            raise ConfigError(str(exc), where=f"{where}: {key}.sentinels[{i}]") from None
        if password_env is not None:
            ep = replace(ep, password=environ[password_env])
        sentinels.append(ep)
    return SentinelRef(master=master, sentinels=tuple(sentinels))


def sentinel_endpoint(text: str) -> Endpoint:
    """A Sentinel given as `host[:port]` or a redis:// URL (port 26379 when none is given)."""
    url = text if "://" in text else f"redis://{text}"
    ep = Endpoint.from_url(url)
    if urlsplit(url).port is None:
        ep = replace(ep, port=26379)
    return replace(ep, name=f"sentinel {ep.host}:{ep.port}")


def _no_unknown(raw: Mapping[str, Any], known: set[str], *, where: str, key: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r} (expected {', '.join(sorted(known))})",
            where=f"{where}: {key}",
        )


def _endpoint(
    raw: Any,
    *,
    where: str,
    key: str,
    default_name: str,
    region: str | None,
    kind: EndpointKind,
    environ: Mapping[str, str],
) -> Endpoint:
    rack = None
    password_env = None
    local = None
    if isinstance(raw, dict):
        _no_unknown(raw, _ENDPOINT_KEYS, where=where, key=key)
        url = raw.get("url")
        default_name = raw.get("name", default_name)
        rack = raw.get("rack")
        kind = raw.get("kind", kind)
        password_env = raw.get("password_env")
        local = raw.get("local")
        if kind not in ("redis", "dynomite"):
            raise ConfigError(
                f"expected redis or dynomite, got {kind!r}", where=f"{where}: {key}.kind"
            )
        if not isinstance(default_name, str) or not default_name:
            raise ConfigError("name must be a non-empty string", where=f"{where}: {key}.name")
    else:
        url = raw
    if not isinstance(url, str):
        raise ConfigError(
            "expected a Redis URL string or a table with `url`", where=f"{where}: {key}"
        )
    try:
        ep = Endpoint.from_url(str(url), name=default_name, kind=kind, region=region, rack=rack)
    except ValueError as exc:
        raise ConfigError(str(exc), where=f"{where}: {key}") from None
    if local is not None:
        ep = replace(ep, local=_local_address(local, ep, where=f"{where}: {key}.local"))
    if password_env:
        if password_env not in environ:
            raise ConfigError(
                f"environment variable {password_env} is not set",
                where=f"{where}: {key}.password_env",
            )
        ep = replace(ep, password=environ[password_env])
    return ep


def _local_address(raw: Any, ep: Endpoint, *, where: str) -> tuple[str, int]:
    """`local = "redis://host:port"`: the same server (database, credentials, TLS) from
    inside its region; only the address differs."""
    if not isinstance(raw, str):
        raise ConfigError("expected a Redis URL string", where=where)
    try:
        local = Endpoint.from_url(raw)
    except ValueError as exc:
        raise ConfigError(str(exc), where=where) from None
    if local.username or local.password:
        raise ConfigError("credentials belong in `url` or `password_env`, not here", where=where)
    if local.tls != ep.tls:
        raise ConfigError(f"scheme differs from the url's ({ep.url()})", where=where)
    if local.db != ep.db and urlsplit(raw).path.strip("/"):
        raise ConfigError(f"database {local.db} differs from the url's ({ep.db})", where=where)
    return local.host, local.port


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


def _endpoint_table(ep: Endpoint, *, redact: bool) -> dict[str, Any]:
    table: dict[str, Any] = {"name": ep.name, "url": ep.url(redact=redact)}
    if ep.local is not None:
        table["local"] = f"{'rediss' if ep.tls else 'redis'}://{ep.local[0]}:{ep.local[1]}"
    if ep.rack:
        table["rack"] = ep.rack
    if ep.kind != "redis":
        table["kind"] = ep.kind
    return table


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
    comments = comments or {}
    endpoint_comments = endpoint_comments or {}

    def comment(text: str, indent: str = "") -> list[str]:
        return [f"{indent}# {line}".rstrip() for line in text.splitlines()]

    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    if settings:
        lines += ["", "[settings]"] + [f"{k} = {_toml_value(v)}" for k, v in settings.items()]
    for region in topology.regions:
        lines.append("")
        if region.name in comments:
            lines += comment(comments[region.name])
        lines += ["[[regions]]", f"name = {_toml_value(region.name)}"]
        if region.agent:
            lines.append(f"agent = {_toml_value(region.agent)}")
        if region.write:
            if region.write.name in endpoint_comments:
                lines += comment(endpoint_comments[region.write.name])
            lines.append(f"write = {_toml_value(_endpoint_table(region.write, redact=redact))}")
            if region.write.kind != "redis":
                lines.append(f"write_kind = {_toml_value(region.write.kind)}")
        lines.append("replicas = [")
        for ep in region.replicas:
            if ep.name in endpoint_comments:
                lines += comment(endpoint_comments[ep.name], "  ")
            lines.append(f"  {_toml_value(_endpoint_table(ep, redact=redact))},")
        lines.append("]")
        if region.slots:
            lines.append(f"slots = {_toml_value([list(s) for s in region.slots])}")
        if region.sentinel:
            ref = region.sentinel
            table = {
                "master": ref.master,
                "sentinels": [s.url(redact=redact) for s in ref.sentinels],
            }
            lines.append(f"sentinel = {_toml_value(table)}")
    region_names = {
        ep.name for r in topology.regions for ep in ((r.write,) if r.write else ()) + r.replicas
    }
    for group in topology.groups:
        lines.append("")
        if group.name in comments:
            lines += comment(comments[group.name])
        lines += ["[[groups]]", f"name = {_toml_value(group.name)}"]
        members: list[Any] = [
            m.name if m.name in region_names else _endpoint_table(m, redact=redact)
            for m in group.members
        ]
        lines.append(f"members = {_toml_value(members)}")
        if group.slots:
            lines.append(f"slots = {_toml_value([list(s) for s in group.slots])}")
    return "\n".join(lines).lstrip("\n") + "\n"


def write_config_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, mode 0600, so nothing is half-written."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
