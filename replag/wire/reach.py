"""Where credentials and writes may go: the endpoints the topology names, and the networks
the user allowed (`allow_networks`).

Servers point elsewhere: a Sentinel names the master, CLUSTER SHARDS and MOVED name
nodes, INFO replication names a primary and replicas. replag follows such an answer
with the credentials of the endpoint that gave it, so a server that lies could receive
them (and the probe's writes) at any address it likes. `Reach.admit` is asked before
such a host is contacted: a host the topology names, or an address inside
`allow_networks`, is admitted; anything else raises `OutsideReach` (one line naming the
host, who named it, and the setting) and is not contacted. A host name the topology does
not name is outside unless every address it resolves to is inside (`Reach.resolve`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from replag.errors import OutsideReach
from replag.topology import Endpoint, Topology

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(text: str | Iterable[str]) -> tuple[Network, ...]:
    """`10.0.0.0/8,192.168.1.0/24,::1` (a bare address is a /32 or /128); ValueError if bad."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    return tuple(ipaddress.ip_network(p.strip(), strict=False) for p in parts if p.strip())


@dataclass(frozen=True)
class Reach:
    """`named`: host:port pairs the topology names (with their `local` addresses);
    `networks`: allow_networks."""

    named: frozenset[tuple[str, int]]
    networks: tuple[Network, ...] = ()

    @classmethod
    def of(cls, topology: Topology, networks: Iterable[str] | None = None) -> Reach:
        named: set[tuple[str, int]] = set()
        for ep in topology.endpoints():
            named.add((ep.host, ep.port))
            if ep.local:
                named.add(ep.local)
        for region in topology.regions:
            if region.sentinel is not None:
                named.update((s.host, s.port) for s in region.sentinel.sentinels)
        nets = parse_networks(topology.allow_networks if networks is None else networks)
        return cls(frozenset(named), nets)

    def setting_text(self) -> str:
        shown = ", ".join(map(str, self.networks)) or "none"
        return f"allow_networks = {shown}"

    def outside(self, host: str, port: int) -> str | None:
        """Why host:port may not be contacted (None: it may), without resolving names."""
        if (host, port) in self.named:
            return None
        try:
            address = ipaddress.ip_address(host.split("%")[0])
        except ValueError:
            return f"{host} is a host name the topology does not name"
        if any(address in network for network in self.networks):
            return None
        return f"{host} is outside the topology"

    async def resolve(self, host: str, port: int) -> str | None:
        """As `outside`, a host name admitted when every address it resolves to is inside."""
        why = self.outside(host, port)
        if why is None or not self.networks or not why.endswith("does not name"):
            return why
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            return f"{host} does not resolve ({exc})"
        for info in infos:
            address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
            if not any(address in network for network in self.networks):
                return f"{host} is {address}, outside the topology"
        return None

    def admit(self, endpoint: Endpoint, *, named_by: str, as_what: str) -> Endpoint:
        """`endpoint` if it may be contacted, else OutsideReach naming who named it
        (`named_by`, e.g. "Sentinel 10.0.0.9:26379") and as what."""
        why = self.outside(endpoint.host, endpoint.port)
        if why is not None:
            raise self.refusal(endpoint.address, why, named_by=named_by, as_what=as_what)
        return endpoint

    def refusal(self, address: str, why: str, *, named_by: str, as_what: str) -> OutsideReach:
        return OutsideReach(
            f"named {address} as {as_what}: not contacted, no credentials or writes sent "
            f"({why}, and {self.setting_text()})",
            where=named_by,
        )


__all__ = ["Network", "OutsideReach", "Reach", "parse_networks"]
