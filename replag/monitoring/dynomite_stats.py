"""Dynomite `/info` samples: fetched from every node at once, kept in the store.

The `dynomite_stats` table (one row per node per collection, a column per
figure of `dynomite_figures.FIGURES`; its schema is in the store's migrations)
belongs to this module: its writes, its reads of the latest samples, its pruning.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from replag.discovery.http import fetch_json_object
from replag.errors import ReplagError
from replag.monitoring.dynomite_figures import FIGURE_NAMES, DynomiteStats, parse_info
from replag.store import Row, Store


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


def prune_stats(store: Store, before_ns: int) -> int:
    """Delete samples taken before `before_ns` (UTC epoch ns, the retention cutoff)."""
    return max(
        0, store.execute("DELETE FROM dynomite_stats WHERE sampled_ns < ?", (before_ns,)).rowcount
    )


def record_stats(store: Store, samples: Sequence[DynomiteStats]) -> None:
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
    columns = ", ".join(("node", "dc", "rack", "sampled_ns", "uptime_s", *FIGURE_NAMES, "backends"))
    if node is not None:
        nodes = [node]
    else:
        # Distinct nodes by skipping through the index (SQLite has no skip-scan for DISTINCT).
        nodes = [
            row.node
            for row in store.execute(
                """WITH RECURSIVE n(node) AS (
                       SELECT MIN(node) FROM dynomite_stats
                       UNION ALL
                       SELECT (SELECT MIN(node) FROM dynomite_stats WHERE node > n.node)
                       FROM n WHERE n.node IS NOT NULL)
                   SELECT node FROM n WHERE node IS NOT NULL"""
            )
        ]
    rows: list[Row] = []
    for name in nodes:
        latest = store.execute(
            f"""SELECT {columns} FROM dynomite_stats WHERE node = ?
                ORDER BY sampled_ns DESC, id DESC LIMIT ?""",
            (name, limit),
        )
        rows += reversed(latest)
    out = []
    for row in rows:
        figures = {name: getattr(row, name) for name in FIGURE_NAMES}
        out.append(
            DynomiteStats(
                node=row.node,
                dc=row.dc,
                rack=row.rack,
                sampled_ns=row.sampled_ns,
                uptime_s=row.uptime_s,
                figures=figures,
                backends=tuple(b for b in row.backends.split(",") if b),
            )
        )
    return out
