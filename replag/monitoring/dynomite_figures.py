"""Dynomite `/info`: the figures replag reads from it, and one node's parsed sample.

`FIGURES` is the table (Dynomite's key, where it lives in /info, what it means,
whether it only grows); `parse_info` turns one answer into a `DynomiteStats`.
Collecting and storing samples is `dynomite_stats`, reading dropped writes out of
them `dropped_writes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from replag.errors import DiscoveryError

Section = Literal["top", "dyn_o_mite", "backends"]


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One number read from /info: where it lives there, and what it means."""

    name: str  # our column / metric name
    key: str  # Dynomite's key
    section: Section  # top level, "dyn_o_mite", or summed over the backend servers
    help: str
    counter: bool = False  # only grows, until a restart or Dynomite's periodic reset


FIGURES: tuple[Figure, ...] = (
    Figure(
        name="peer_dropped_requests",
        key="peer_dropped_requests",
        section="dyn_o_mite",
        counter=True,
        help="Requests to peers in this DC dropped when their link closed with them queued.",
    ),
    Figure(
        name="peer_timedout_requests",
        key="peer_timedout_requests",
        section="dyn_o_mite",
        counter=True,
        help="Requests to peers in this DC that timed out.",
    ),
    Figure(
        name="remote_peer_dropped_requests",
        key="remote_peer_dropped_requests",
        section="dyn_o_mite",
        counter=True,
        help="Requests to other DCs' peers dropped (link closed with them queued, or no "
        "rack to fail over to).",
    ),
    Figure(
        name="remote_peer_timedout_requests",
        key="remote_peer_timedout_requests",
        section="dyn_o_mite",
        counter=True,
        help="Requests to other DCs' peers timed out.",
    ),
    Figure(
        name="client_dropped_requests",
        key="client_dropped_requests",
        section="dyn_o_mite",
        counter=True,
        help="Client requests dropped by this node.",
    ),
    Figure(
        name="client_non_quorum_w_responses",
        key="client_non_quorum_w_responses",
        section="dyn_o_mite",
        counter=True,
        help="Writes answered without reaching quorum.",
    ),
    Figure(
        name="peer_eof",
        key="peer_eof",
        section="dyn_o_mite",
        counter=True,
        help="Peer connections closed by the peer (it stopped or restarted).",
    ),
    Figure(
        name="peer_err",
        key="peer_err",
        section="dyn_o_mite",
        counter=True,
        help="Peer connections failed (refused or broken; grows with each reconnect attempt "
        "while a peer is down).",
    ),
    Figure(
        name="peer_timedout",
        key="peer_timedout",
        section="dyn_o_mite",
        counter=True,
        help="Peer connections in this DC closed on a timeout.",
    ),
    Figure(
        name="remote_peer_timedout",
        key="remote_peer_timedout",
        section="dyn_o_mite",
        counter=True,
        help="Peer connections to other DCs closed on a timeout.",
    ),
    Figure(
        name="peer_connections",
        key="peer_connections",
        section="dyn_o_mite",
        help="Peer connections open now (one per peer node by default).",
    ),
    Figure(
        name="peer_ejects",
        key="peer_ejects",
        section="dyn_o_mite",
        counter=True,
        help="Times a peer was ejected.",
    ),
    Figure(
        name="peer_in_queue",
        key="peer_in_queue",
        section="dyn_o_mite",
        help="Requests queued from local-DC peers now.",
    ),
    Figure(
        name="peer_out_queue",
        key="peer_out_queue",
        section="dyn_o_mite",
        help="Requests queued to local-DC peers now.",
    ),
    Figure(
        name="remote_peer_in_queue",
        key="remote_peer_in_queue",
        section="dyn_o_mite",
        help="Requests queued from other DCs' peers now.",
    ),
    Figure(
        name="remote_peer_out_queue",
        key="remote_peer_out_queue",
        section="dyn_o_mite",
        help="Requests queued to other DCs' peers now.",
    ),
    Figure(
        name="cross_zone_latency_avg_us",
        key="average_cross_zone_latency",
        section="top",
        help="Mean latency of requests to other racks (µs).",
    ),
    Figure(
        name="cross_zone_latency_p99_us",
        key="99_cross_zone_latency",
        section="top",
        help="p99 latency of requests to other racks (µs).",
    ),
    Figure(
        name="cross_region_rtt_avg_us",
        key="average_cross_region_rtt",
        section="top",
        help="Mean round trip to other DCs (µs).",
    ),
    Figure(
        name="cross_region_rtt_p99_us",
        key="99_cross_region_rtt",
        section="top",
        help="p99 round trip to other DCs (µs).",
    ),
    Figure(
        name="cross_zone_queue_wait_p99_us",
        key="99_cross_zone_queue_wait",
        section="top",
        help="p99 time requests to other racks waited in queue (µs).",
    ),
    Figure(
        name="cross_region_queue_wait_p99_us",
        key="99_cross_region_queue_wait",
        section="top",
        help="p99 time requests to other DCs waited in queue (µs).",
    ),
    Figure(
        name="peer_out_queue_p99",
        key="peer_out_queue_99",
        section="top",
        help="p99 length of the queue to local-DC peers.",
    ),
    Figure(
        name="remote_peer_out_queue_p99",
        key="remote_peer_out_queue_99",
        section="top",
        help="p99 length of the queue to other DCs' peers.",
    ),
    Figure(
        name="server_latency_p99_us",
        key="99_server_latency",
        section="top",
        help="p99 latency of the backend Redis (µs).",
    ),
    Figure(
        name="server_dropped_requests",
        key="server_dropped_requests",
        section="backends",
        counter=True,
        help="Requests to the backend Redis dropped.",
    ),
    Figure(
        name="server_timedout_requests",
        key="server_timedout_requests",
        section="backends",
        counter=True,
        help="Requests to the backend Redis that timed out.",
    ),
)
FIGURE_NAMES = tuple(f.name for f in FIGURES)


@dataclass(frozen=True, kw_only=True)
class DynomiteStats:
    """One /info sample of one node. A figure the node did not report is None."""

    node: str  # its stats URL
    dc: str
    rack: str
    sampled_ns: int  # our UTC epoch ns when the answer arrived
    uptime_s: int
    figures: Mapping[str, int | None]
    backends: tuple[str, ...] = ()  # backend Redis addresses as the node names them

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "dc": self.dc,
            "rack": self.rack,
            "sampled_ns": self.sampled_ns,
            "uptime_s": self.uptime_s,
            "backends": list(self.backends),
            **self.figures,
        }


def parse_info(data: Mapping[str, Any], *, node: str, sampled_ns: int) -> DynomiteStats:
    """A DynomiteStats from a parsed /info answer; DiscoveryError naming what is missing."""
    where = f"{node}/info"
    if data.get("service") != "dynomite":
        raise DiscoveryError("not a Dynomite /info answer (no service: dynomite)", where=where)
    pool = data.get("dyn_o_mite")
    if not isinstance(pool, dict):
        raise DiscoveryError("no `dyn_o_mite` object in /info", where=where)
    # The backend servers are the objects inside the pool, keyed by their host:port.
    backends = {key: value for key, value in pool.items() if isinstance(value, dict)}
    sections: dict[Section, Mapping[str, Any]] = {"top": data, "dyn_o_mite": pool}
    figures: dict[str, int | None] = {}
    for figure in FIGURES:
        if figure.section == "backends":
            numbers = [
                n for b in backends.values() if (n := _number(b.get(figure.key))) is not None
            ]
            figures[figure.name] = sum(numbers) if numbers else None
        else:
            figures[figure.name] = _number(sections[figure.section].get(figure.key))
    if figures["peer_dropped_requests"] is None:
        raise DiscoveryError("/info has no dyn_o_mite.peer_dropped_requests", where=where)
    dc, rack, uptime = data.get("dc"), data.get("rack"), _number(data.get("uptime"))
    if not isinstance(dc, str) or not isinstance(rack, str) or uptime is None:
        raise DiscoveryError("/info lacks dc, rack or uptime", where=where)
    return DynomiteStats(
        node=node,
        dc=dc,
        rack=rack,
        sampled_ns=sampled_ns,
        uptime_s=uptime,
        figures=figures,
        backends=tuple(backends),
    )


def _number(value: Any) -> int | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    return None
