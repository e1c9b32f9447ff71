"""Where a Dynomite node's client port, stats port and backend Redis are: port conventions
(Netflix's 8101 peer, 8102 client, 22222 stats, 22122 Redis) and per-node overrides from
`--port-map HOST:PEER=client:PORT,redis:PORT,stats:PORT` or a TOML file."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from replag.errors import DiscoveryError, UsageError

_PORT_NAMES = ("client", "redis", "stats")


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, kw_only=True)
class NodePorts:
    """Per-node override: where one node's client port, stats port and backend Redis are."""

    client: Address | None = None
    redis: Address | None = None
    stats: Address | None = None


@dataclass(frozen=True, kw_only=True)
class PortMap:
    """Port conventions plus overrides keyed by the node's peer address ("host:peer_port")."""

    peer: int = 8101
    client: int = 8102
    stats: int = 22222
    redis: int = 22122
    overrides: Mapping[str, NodePorts] = field(default_factory=dict)

    def resolve(self, host: str, peer_port: int, *, where: str, label: str) -> dict[str, Address]:
        """The client and stats addresses of the node at host:peer_port, and its backend
        Redis where an override gives it (else it is read from the node's /info)."""
        override = self.overrides.get(f"{host}:{peer_port}", NodePorts())
        by_convention = {"client": self.client, "stats": self.stats}
        out: dict[str, Address] = {}
        if override.redis is not None:
            out["redis"] = override.redis
        missing = []
        for name in ("client", "stats"):
            given: Address | None = getattr(override, name)
            if given is not None:
                out[name] = given
            elif peer_port != self.peer:
                # A node off the peer-port convention runs off the other conventions too
                # (several nodes on one host): guessing its ports would probe the wrong server.
                missing.append(name)
            else:
                out[name] = Address(host, by_convention[name])
        if missing:
            given_keys = [n for n in _PORT_NAMES if getattr(override, n) is not None]
            said = f"its --port-map gives {', '.join(given_keys)} but" if given_keys else "and"
            raise DiscoveryError(
                f"node {host}:{peer_port} ({label}) uses peer port {peer_port}, not the "
                f"convention's {self.peer}, {said} not {' or '.join(missing)}: give "
                f"{'it' if len(missing) == 1 else 'them'} with "
                f"--port-map {host}:{peer_port}="
                + ",".join(f"{n}:PORT" for n in missing)
                + " (redis: is optional, each node's /info names its backend)",
                where=where,
            )
        return out


def parse_port_override(text: str) -> tuple[str, NodePorts]:
    """`HOST:PEER=client:8102,redis:[HOST:]22121,stats:22222` → (peer address, NodePorts)."""
    peer, sep, rest = text.partition("=")
    host, _, port = peer.rpartition(":")
    if not sep or not host or not port.isdigit() or not rest:
        raise UsageError(
            f"--port-map {text!r}: expected HOST:PEERPORT=client:PORT,redis:PORT,stats:PORT"
        )
    values: dict[str, Address] = {}
    for item in rest.split(","):
        name, _, value = item.strip().partition(":")
        if name not in _PORT_NAMES:
            raise UsageError(f"--port-map {text!r}: {name!r} is not one of client, redis, stats")
        values[name] = _address(value, default_host=host, what=f"--port-map {text!r}")
    return f"{host}:{int(port)}", NodePorts(**values)


def load_port_map_file(path: Path, base: PortMap) -> PortMap:
    """Read port conventions and per-node overrides from a TOML file (docs: Dynomite)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read the port map: {exc}", where=str(path)) from None
    unknown = sorted(set(data) - {"conventions", "nodes"})
    if unknown:
        raise UsageError(f"unknown table {unknown[0]!r} (want conventions, nodes)", where=str(path))
    conventions = data.get("conventions", {})
    changes: dict[str, Any] = {}
    for key, value in conventions.items():
        name = key.removesuffix("_port")
        if name not in ("peer", *_PORT_NAMES) or not isinstance(value, int):
            raise UsageError(
                f"conventions.{key}: expected peer/client/redis/stats_port = PORT", where=str(path)
            )
        changes[name] = value
    overrides = dict(base.overrides)
    for peer, table in data.get("nodes", {}).items():
        if not isinstance(table, dict) or set(table) - set(_PORT_NAMES):
            raise UsageError(f'nodes."{peer}": expected client, redis, stats keys', where=str(path))
        host = peer.rpartition(":")[0] or peer
        overrides[peer] = NodePorts(
            **{
                name: _address(str(value), default_host=host, what=f'{path}: nodes."{peer}".{name}')
                for name, value in table.items()
            }
        )
    return replace(base, overrides=overrides, **changes)


def _address(value: str, *, default_host: str, what: str) -> Address:
    host, _, port = value.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{what}: bad port in {value!r}")
    return Address(host or default_host, int(port))
