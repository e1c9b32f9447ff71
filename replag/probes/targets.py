"""Which replicas a source's probe writes should reach, and the name each is shown under.

The replica is the unit of every lag figure: a lag window, a `/metrics` series,
a health verdict and an alert are each about one (source, target, replica).
Behind a Dynomite client port the unit is a rack (a key lands on the one node
of the rack owning its token), named after the rack when it has several nodes;
elsewhere it is one server. `observed_replicas()` lists them from the topology
alone, so the service can create every series before the first probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from replag.topology import Endpoint, Region, Topology

if TYPE_CHECKING:
    from replag.errors import PermissionRefused, TlsError
    from replag.probes.observers import Observer
    from replag.wire.resp import RespConnection


@dataclass(frozen=True, kw_only=True)
class ObservedReplica:
    """One unit of observation: `replica` is its label, `rack` the Dynomite rack (if any)."""

    source: str
    target: str
    replica: str
    rack: str | None
    endpoints: tuple[Endpoint, ...]


def unit_label(endpoints: list[Endpoint], *, by_rack: bool) -> tuple[str, str | None]:
    """(replica label, rack) of one unit of observation."""
    first = endpoints[0]
    rack = first.rack if by_rack else None
    if len(endpoints) > 1 and first.rack:
        return first.rack, first.rack
    return first.name, rack


def unit_key(region: str, endpoint: Endpoint, *, by_rack: bool) -> tuple[str, str]:
    """Servers with the same key count together: one rack of a Dynomite DC, else one server."""
    return region, endpoint.rack if by_rack and endpoint.rack else endpoint.name


def observed_replicas(
    topology: Topology, source: Region, write: Endpoint | None = None
) -> list[ObservedReplica]:
    """Every unit a probe from `source` (writing through `write`, by default its configured
    write endpoint) observes, labelled as its lag windows will be."""
    write = write or source.write
    if write is None:
        return []
    servers, _ = topology.reached_from(source, write)
    by_rack = write.kind == "dynomite"
    units: dict[tuple[str, str], list[Endpoint]] = {}
    for region, ep in servers:
        units.setdefault(unit_key(region.name, ep, by_rack=by_rack), []).append(ep)
    out = []
    for (target, _), endpoints in units.items():
        label, rack = unit_label(endpoints, by_rack=by_rack)
        out.append(
            ObservedReplica(
                source=source.name,
                target=target,
                replica=label,
                rack=rack,
                endpoints=tuple(endpoints),
            )
        )
    return out


@dataclass
class ReplicaTarget:
    region: str
    replica: Endpoint
    cluster: bool = False
    conn: RespConnection | None = None
    observer: Observer | None = None
    error: str | None = None
    # It answered LOADING (loading its dataset: a resync's snapshot, or after a restart).
    loading: bool = False
    # A certificate or an ACL permission refused: a configuration error, not an outage:
    # the run stops (exit 2).
    fatal: TlsError | PermissionRefused | None = None


def observation_units(targets: list[ReplicaTarget], *, by_rack: bool) -> list[list[ReplicaTarget]]:
    """Targets whose arrivals count together: one rack of a Dynomite DC, else one replica.

    In a Dynomite rack of several nodes each key lives on the one node owning its
    token, so the rack (not each backend) is what received the write or not.
    """
    units: dict[tuple[str, str], list[ReplicaTarget]] = {}
    for t in targets:
        units.setdefault(unit_key(t.region, t.replica, by_rack=by_rack), []).append(t)
    return list(units.values())
