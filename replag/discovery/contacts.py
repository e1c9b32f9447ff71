"""Which hosts discovery may contact with the credentials it was given, and which it did.

Discovery follows what servers say (INFO replication's `master_host` and `slaveN`
lines), and reaches every node with the user and password of the URL given: a
server that lies can name any host and receive them. `Contacts` records each
address the credentials went to (said on stderr and in the written file), and with
`--allow-networks` refuses, before connecting, any host outside the networks named
(a host name counts as inside only if every address it resolves to is).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field

from replag.errors import DiscoveryError, UsageError
from replag.topology import Endpoint

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class OutsideNetworks(DiscoveryError):
    """A host discovery was led to is outside --allow-networks: it was not contacted."""


def parse_networks(text: str) -> tuple[Network, ...]:
    """`10.0.0.0/8,192.168.1.0/24,::1` (a bare address is a /32 or /128); UsageError if bad."""
    networks = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError as exc:
            raise UsageError(f"--allow-networks: {exc}") from None
    if not networks:
        raise UsageError("--allow-networks: name at least one network (CIDR)")
    return tuple(networks)


@dataclass
class Contacts:
    """`networks`: where discovery may connect (None: anywhere); `credentialed`: the
    addresses that received the credentials, in the order first contacted."""

    networks: tuple[Network, ...] | None = None
    credentialed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)

    async def reach(self, endpoint: Endpoint) -> None:
        """Before connecting to `endpoint`: OutsideNetworks if it may not be contacted;
        else, if it carries credentials, it is recorded as having received them."""
        if self.networks is not None:
            outside = await self._outside(endpoint.host, endpoint.port)
            if outside is not None:
                self.refused[endpoint.address] = outside
                raise OutsideNetworks(
                    f"not contacted: {outside}, outside --allow-networks "
                    f"{', '.join(map(str, self.networks))}",
                    where=endpoint.address,
                )
        if endpoint.password and endpoint.address not in self.credentialed:
            self.credentialed.append(endpoint.address)

    async def admits(self, host: str, port: int) -> bool:
        """Whether host:port is inside the networks (if not, recorded as refused)."""
        if self.networks is None:
            return True
        outside = await self._outside(host, port)
        if outside is not None:
            self.refused[f"{host}:{port}"] = outside
        return outside is None

    async def _outside(self, host: str, port: int) -> str | None:
        assert self.networks is not None
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
            except OSError as exc:
                return f"{host} does not resolve ({exc})"
            addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
        for address in addresses:
            if not any(address in network for network in self.networks):
                return f"{host} is {address}" if str(address) != host else host
        return None

    def header_lines(self) -> list[str]:
        """What the written file says about where the credentials went."""
        lines = []
        if self.credentialed:
            lines.append(
                "The URL's credentials were sent to: " + ", ".join(self.credentialed) + "."
            )
        if self.refused:
            lines.append(
                "Not contacted (outside --allow-networks): " + ", ".join(sorted(self.refused)) + "."
            )
        return lines
