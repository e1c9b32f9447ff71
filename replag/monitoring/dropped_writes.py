"""Dropped writes, read from two `/info` samples of a Dynomite node.

Under DC_ONE Dynomite reports no per-replica lag, and it drops the writes for a
peer it holds no connection to without counting them ("Swallowing cross rack
error due to DC_ONE" in its log only; v0.6.22, dyn_client.c). What `/info`
does show is the peer links breaking: `peer_eof` (a peer closed the link: it
stopped or restarted), `peer_err` (a connect or send failed: it grows with
every reconnect attempt while a peer is down), `peer_timedout` /
`remote_peer_timedout`, and `peer_dropped_requests` /
`remote_peer_dropped_requests` (requests queued on a link when it closed,
dyn_dnode_peer.c). Any growth means a peer missed writes sent meanwhile, which
stay missing there (no hinted handoff): replicas may have diverged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replag.monitoring.dynomite_figures import DynomiteStats
from replag.monitoring.dynomite_stats import recent_stats
from replag.store import Store

DROPPED_WRITES_MESSAGE = "writes were dropped; replicas may have diverged: run repair"

# Counters that grow when a peer link breaks or cannot be made: writes for that peer
# are dropped meanwhile under DC_ONE (without being counted anywhere).
LINK_FAILURES = ("peer_eof", "peer_err", "peer_timedout", "remote_peer_timedout")
DROPPED_REQUESTS = ("peer_dropped_requests", "remote_peer_dropped_requests")


def counter_growth(previous: DynomiteStats | None, current: DynomiteStats, name: str) -> int:
    """How much counter `name` grew from `previous` to `current` (same node).

    A restart (uptime went back) or Dynomite's periodic reset (the counter went
    back) means everything counted now happened since: the growth is the
    current value, a lower bound of what happened between the two samples.
    """
    now = current.figures.get(name) or 0
    if previous is None:
        return 0  # no baseline: what was dropped before we looked is not news
    before = previous.figures.get(name) or 0
    if current.uptime_s < previous.uptime_s or now < before:
        return now
    return now - before


@dataclass(frozen=True, kw_only=True)
class DroppedWrites:
    """A node whose peers missed writes between two samples: the alert rule's finding."""

    node: str
    dc: str
    rack: str
    dropped: int  # peer + remote-peer requests dropped between the samples
    timed_out: int  # peer + remote-peer requests timed out between the samples
    link_failures: int = 0  # peer links closed, refused or timed out between the samples
    since_ns: int
    until_ns: int
    message: str = DROPPED_WRITES_MESSAGE
    # Peers of this node that do not answer (no /info sample lately): "dc/rack (node)".
    # Under DC_ONE, they are where the dropped writes were headed.
    peers_down: tuple[str, ...] = ()

    @property
    def events(self) -> int:
        """What the rule's threshold counts: dropped requests plus peer link failures."""
        return self.dropped + self.link_failures

    def describe(self) -> str:
        parts = []
        if self.link_failures:
            parts.append(f"{self.link_failures} peer link failures (closed, refused or timed out)")
        if self.dropped:
            parts.append(f"{self.dropped} peer requests dropped ({self.timed_out} timed out)")
        said = " and ".join(parts) or "no peer link failure or dropped request"
        if self.peers_down:
            said += f" (peer down: {', '.join(self.peers_down)})"
        return said

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "dc": self.dc,
            "rack": self.rack,
            "dropped": self.dropped,
            "timed_out": self.timed_out,
            "link_failures": self.link_failures,
            "since_ns": self.since_ns,
            "until_ns": self.until_ns,
            "message": self.message,
            "peers_down": list(self.peers_down),
        }


def link_failure_growth(previous: DynomiteStats, current: DynomiteStats) -> int:
    """Peer link failures between two samples of one node.

    A node that restarted in between counts none: the refusals of its own start-up,
    while its peers' links come up, are not writes lost (its peers, which saw it go,
    report the outage).
    """
    if current.uptime_s < previous.uptime_s:
        return 0
    return sum(counter_growth(previous, current, n) for n in LINK_FAILURES)


def dropped_writes(previous: DynomiteStats | None, current: DynomiteStats) -> DroppedWrites | None:
    """The finding if, from `previous` to `current`, dropped peer requests grew or a peer
    link failed (writes for a peer without a link are dropped under DC_ONE), else None."""
    if previous is None:
        return None
    dropped = sum(counter_growth(previous, current, n) for n in DROPPED_REQUESTS)
    links = link_failure_growth(previous, current)
    if dropped <= 0 and links <= 0:
        return None
    timed_out = sum(
        counter_growth(previous, current, n)
        for n in ("peer_timedout_requests", "remote_peer_timedout_requests")
    )
    return DroppedWrites(
        node=current.node,
        dc=current.dc,
        rack=current.rack,
        dropped=dropped,
        timed_out=timed_out,
        link_failures=links,
        since_ns=previous.sampled_ns,
        until_ns=current.sampled_ns,
    )


def find_dropped_writes(store: Store) -> list[DroppedWrites]:
    """Nodes whose dropped peer requests grew between their last two stored samples."""
    by_node: dict[str, list[DynomiteStats]] = {}
    for sample in recent_stats(store, limit=2):
        by_node.setdefault(sample.node, []).append(sample)
    findings = []
    for samples in by_node.values():
        if len(samples) == 2:
            finding = dropped_writes(samples[0], samples[1])
            if finding is not None:
                findings.append(finding)
    return findings
