"""The agent's `/metrics`: its trees' state and counters, read when Prometheus scrapes.

A collector reads each `LiveTree`'s counters at scrape time (nothing is
updated on the event path), in a registry of the agent's own.

Per replica: `replag_agent_tree_state{state}` (1 for the current one),
`_tree_keys`, `_tree_bytes_per_key`, `_tree_memory_bytes`, `_tree_disk_bytes`
(the names file), `_pending_keys`
(named by events, not yet re-read), `_events_total`, `_keys_applied_total`,
`_builds_total`, `_restores_total`, `_rebuilds_total{cause}` (lost, flush,
notifications, restart, resync), `_build_seconds` and
`_build_replica_cpu_seconds` (the replica's INFO used_cpu during the last full
scan), `_replica_cpu_seconds_total` (the replica's used_cpu, to rate()); and
`replag_agent_response_bytes_total{route}`: what the agent sent, i.e. what
crosses the WAN; `replag_agent_resident_bytes` (the process's RSS) and
`replag_agent_resident_fixed_bytes` (its RSS when it started, before any tree:
the fixed size) and `replag_agent_resident_bytes_per_key` (what it holds beyond
that, over the keys of all its trees): what an agent really costs its host per
key, the fixed size apart, beside the key table's share.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from replag.agent.livetree import STATES

if TYPE_CHECKING:
    from replag.agent.keytable import KeyTable
    from replag.agent.livetree import LiveTree
    from replag.agent.region import RegionAgent

ROUTES = ("nodes", "leaves", "observe", "replicas", "health", "metrics")


def resident_bytes() -> int | None:
    """This process's resident set (Linux /proc), None where unknown."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


# Per replica: (metric, help, its value for a tree; None: no sample for that replica).
Reading = Callable[["LiveTree"], float | None]
_GAUGES: tuple[tuple[str, str, Reading], ...] = (
    ("replag_agent_tree_keys", "Keys tracked.", lambda t: _table(t, len)),
    (
        "replag_agent_tree_bytes_per_key",
        "Memory of the key table per key tracked, beyond its fixed bucket indexes.",
        lambda t: _table(t, lambda table: table.bytes_per_key()),
    ),
    (
        "replag_agent_tree_memory_bytes",
        "Memory of the key table (fixed bucket indexes included).",
        lambda t: _table(t, lambda table: table.nbytes),
    ),
    (
        "replag_agent_tree_disk_bytes",
        "Disk held by the key table's names file (unlinked: gone with the process).",
        lambda t: _table(t, lambda table: table.disk_bytes),
    ),
    (
        "replag_agent_pending_keys",
        "Keys named by events and not yet re-read.",
        lambda t: len(t._dirty),
    ),
    (
        "replag_agent_build_seconds",
        "Duration of the last full scan.",
        lambda t: t.stats.last_build_s,
    ),
    (
        "replag_agent_build_replica_cpu_seconds",
        "The replica's CPU (INFO used_cpu) during the last full scan.",
        lambda t: t.stats.build_replica_cpu_s,
    ),
)
_COUNTERS: tuple[tuple[str, str, Reading], ...] = (
    ("replag_agent_events", "Keyspace events about tracked keys.", lambda t: t.stats.events),
    (
        "replag_agent_keys_applied",
        "Keys re-read and applied to the tree.",
        lambda t: t.stats.keys_applied,
    ),
    ("replag_agent_builds", "Full scans.", lambda t: t.stats.builds),
    ("replag_agent_restores", "Starts from a saved tree.", lambda t: t.stats.restores),
    (
        "replag_agent_replica_cpu_seconds",
        "The replica's used_cpu_user + used_cpu_sys (INFO), as last polled.",
        lambda t: t.stats.replica_cpu_s,
    ),
)


def _table(tree: LiveTree, read: Callable[[KeyTable], float]) -> float | None:
    return None if tree.table is None else read(tree.table)


def _per_replica(
    family: type[GaugeMetricFamily | CounterMetricFamily],
    rows: tuple[tuple[str, str, Reading], ...],
    trees: dict[str, LiveTree],
) -> Iterator[Metric]:
    for metric, doc, read in rows:
        out = family(metric, doc, labels=["replica"])
        for replica, tree in trees.items():
            value = read(tree)
            if value is not None:
                out.add_metric([replica], value)
        yield out


class _TreeCollector(Collector):
    def __init__(self, agent: RegionAgent, sent: dict[str, int]) -> None:
        self.agent = agent
        self.sent_bytes = sent
        # Made with the app, before its lifespan starts the trees: the agent without keys.
        self.fixed_bytes = resident_bytes()

    def collect(self) -> Iterator[Metric]:
        trees = self.agent.trees
        state = GaugeMetricFamily(
            "replag_agent_tree_state",
            "1 for the tree's current state.",
            labels=["replica", "state"],
        )
        rebuilds = CounterMetricFamily(
            "replag_agent_rebuilds", "Stale trees rebuilt, by cause.", labels=["replica", "cause"]
        )
        for name, tree in trees.items():
            for s in STATES:
                state.add_metric([name, s], 1.0 if tree.state == s else 0.0)
            for cause, count in tree.stats.rebuilds.items():
                rebuilds.add_metric([name, cause], count)
        yield state
        yield from _per_replica(GaugeMetricFamily, _GAUGES, trees)
        yield from _per_replica(CounterMetricFamily, _COUNTERS, trees)
        yield rebuilds
        sent = CounterMetricFamily(
            "replag_agent_response_bytes", "Bytes of responses sent, by route.", labels=["route"]
        )
        for route, count in self.sent_bytes.items():
            sent.add_metric([route], count)
        yield sent
        rss = resident_bytes()
        if rss is not None:
            yield GaugeMetricFamily(
                "replag_agent_resident_bytes", "The agent process's resident memory.", value=rss
            )
            if self.fixed_bytes is not None:
                yield GaugeMetricFamily(
                    "replag_agent_resident_fixed_bytes",
                    "The agent's resident memory when it started, before any tree.",
                    value=self.fixed_bytes,
                )
            keys = sum(len(t.table) for t in trees.values() if t.table is not None)
            if keys and self.fixed_bytes is not None:
                yield GaugeMetricFamily(
                    "replag_agent_resident_bytes_per_key",
                    "The agent's resident memory beyond its fixed size, over the keys of all "
                    "its trees: the marginal cost of a key.",
                    value=max(0, rss - self.fixed_bytes) / keys,
                )
        for part in self.agent.parts:
            yield from part.collect()


class AgentMetrics:
    """The agent's registry; `sent()` counts response bytes by route."""

    def __init__(self, agent: RegionAgent) -> None:
        self.registry = CollectorRegistry()
        self.sent_bytes: dict[str, int] = dict.fromkeys(ROUTES, 0)
        self.registry.register(_TreeCollector(agent, self.sent_bytes))

    @staticmethod
    def route_label(path: str) -> str:
        last = path.rstrip("/").rsplit("/", 1)[-1]
        return last if last in ROUTES else "other"

    def sent(self, route: str, count: int) -> None:
        self.sent_bytes[route] = self.sent_bytes.get(route, 0) + count

    def render(self) -> bytes:
        return generate_latest(self.registry)
