"""Dynomite `/info` figures: parsed, collected into the store, and checked for dropped writes.

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

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from replag.discovery.http import fetch_json_object
from replag.errors import DiscoveryError, ReplagError
from replag.store import Store

DROPPED_WRITES_MESSAGE = "writes were dropped; replicas may have diverged: run repair"

# Counters that grow when a peer link breaks or cannot be made: writes for that peer
# are dropped meanwhile under DC_ONE (without being counted anywhere).
LINK_FAILURES = ("peer_eof", "peer_err", "peer_timedout", "remote_peer_timedout")
DROPPED_REQUESTS = ("peer_dropped_requests", "remote_peer_dropped_requests")

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

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS dynomite_stats (\n"
    "    id INTEGER PRIMARY KEY,\n"
    "    node TEXT NOT NULL,\n"
    "    dc TEXT NOT NULL,\n"
    "    rack TEXT NOT NULL,\n"
    "    sampled_ns INTEGER NOT NULL,\n"
    "    uptime_s INTEGER NOT NULL,\n"
    + "".join(f"    {name} INTEGER,\n" for name in FIGURE_NAMES)
    + "    backends TEXT NOT NULL\n)",
    "CREATE INDEX IF NOT EXISTS dynomite_stats_node ON dynomite_stats (node, sampled_ns)",
    # Time-range reads (the dropped-writes rule, retention pruning) without a table scan.
    "CREATE INDEX IF NOT EXISTS dynomite_stats_time ON dynomite_stats (sampled_ns)",
)


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


async def fetch_stats(stats_url: str, *, timeout_s: float) -> DynomiteStats:
    node = stats_url.rstrip("/")
    data = await fetch_json_object(f"{node}/info", timeout_s=timeout_s)
    return parse_info(data, node=node, sampled_ns=time.time_ns())


@dataclass(frozen=True, kw_only=True)
class StatsCollection:
    samples: tuple[DynomiteStats, ...]
    errors: Mapping[str, str] = field(default_factory=dict)  # stats URL → what went wrong


async def collect_dynomite_stats(
    stats_urls: Sequence[str], *, store: Store | None, timeout_s: float
) -> StatsCollection:
    """Fetch every node's /info at once and record the samples; one dead node spoils nothing."""
    results = await asyncio.gather(
        *(fetch_stats(url, timeout_s=timeout_s) for url in stats_urls), return_exceptions=True
    )
    samples, errors = [], {}
    for url, result in zip(stats_urls, results, strict=True):
        if isinstance(result, ReplagError):
            errors[url] = str(result)
        elif isinstance(result, BaseException):
            raise result
        else:
            samples.append(result)
    if store is not None and samples:
        record_stats(store, samples)
    return StatsCollection(samples=tuple(samples), errors=errors)


def ensure_stats_schema(store: Store) -> None:
    store.ensure_schema(_SCHEMA)
    columns = {row[1] for row in store.execute("PRAGMA table_info(dynomite_stats)")}
    for name in FIGURE_NAMES:
        if name not in columns:  # a store from before this figure was collected
            store.execute(f"ALTER TABLE dynomite_stats ADD COLUMN {name} INTEGER")


def prune_stats(store: Store, before_ns: int) -> int:
    """Delete samples taken before `before_ns` (UTC epoch ns, the retention cutoff)."""
    ensure_stats_schema(store)
    query = "FROM dynomite_stats WHERE sampled_ns < ?"
    count = int(store.execute(f"SELECT COUNT(*) {query}", (before_ns,))[0][0])
    if count:
        store.execute(f"DELETE {query}", (before_ns,))
    return count


def record_stats(store: Store, samples: Sequence[DynomiteStats]) -> None:
    ensure_stats_schema(store)
    columns = ("node", "dc", "rack", "sampled_ns", "uptime_s", *FIGURE_NAMES, "backends")
    sql = (
        f"INSERT INTO dynomite_stats ({', '.join(columns)}) "
        f"VALUES ({', '.join('?' for _ in columns)})"
    )
    store.transaction(
        (
            sql,
            (
                s.node,
                s.dc,
                s.rack,
                s.sampled_ns,
                s.uptime_s,
                *(s.figures.get(n) for n in FIGURE_NAMES),
                ",".join(s.backends),
            ),
        )
        for s in samples
    )


def recent_stats(store: Store, *, node: str | None = None, limit: int = 2) -> list[DynomiteStats]:
    """The last `limit` samples of each node (or of `node`), oldest first per node.

    Read through the (node, sampled_ns) index, node by node: the table holds a sample
    per node per collection for the whole retention period, and this runs after every
    collection, so it must not scan the table.
    """
    ensure_stats_schema(store)
    columns = ", ".join(("node", "dc", "rack", "sampled_ns", "uptime_s", *FIGURE_NAMES, "backends"))
    if node is not None:
        nodes = [node]
    else:
        # Distinct nodes by skipping through the index (SQLite has no skip-scan for DISTINCT).
        nodes = [
            row[0]
            for row in store.execute(
                """WITH RECURSIVE n(node) AS (
                       SELECT MIN(node) FROM dynomite_stats
                       UNION ALL
                       SELECT (SELECT MIN(node) FROM dynomite_stats WHERE node > n.node)
                       FROM n WHERE n.node IS NOT NULL)
                   SELECT node FROM n WHERE node IS NOT NULL"""
            )
        ]
    rows: list[tuple[Any, ...]] = []
    for name in nodes:
        latest = store.execute(
            f"""SELECT {columns} FROM dynomite_stats WHERE node = ?
                ORDER BY sampled_ns DESC, id DESC LIMIT ?""",
            (name, limit),
        )
        rows += reversed(latest)
    out = []
    for row in rows:
        figures = dict(zip(FIGURE_NAMES, row[5:-1], strict=True))
        out.append(
            DynomiteStats(
                node=row[0],
                dc=row[1],
                rack=row[2],
                sampled_ns=row[3],
                uptime_s=row[4],
                figures=figures,
                backends=tuple(b for b in row[-1].split(",") if b),
            )
        )
    return out


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
        return " and ".join(parts) or "no peer link failure or dropped request"

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
