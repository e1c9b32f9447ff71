"""Dynomite `/info` samples: fetched from every node at once, kept in the store.

The `dynomite_stats` table (one row per node per collection, a column per
figure of `dynomite_figures.FIGURES`) belongs to this module: its schema, its
writes, its reads of the latest samples, and its pruning.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from replag.discovery.http import fetch_json_object
from replag.errors import ReplagError
from replag.monitoring.dynomite_figures import FIGURE_NAMES, DynomiteStats, parse_info
from replag.store import Store

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
