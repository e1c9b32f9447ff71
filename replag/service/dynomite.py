"""Dynomite stats: every configured node's /info into the store and metrics, and the view."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from replag.alerts.rules import dropped_writes_since, stale_after_s
from replag.config import Config
from replag.metrics import ServiceMetrics
from replag.monitoring.dynomite_figures import FIGURES
from replag.monitoring.dynomite_stats import collect_dynomite_stats, recent_stats, record_stats
from replag.service.leasing import Fence
from replag.service.scheduler import Claim
from replag.store import Store

log = logging.getLogger("replag.service")


class DynomiteStatsRound:
    """Reads every `dynomite_stats_urls` node's /info every `probe_interval`, then alerts.

    A node that does not answer is logged when it starts or stops failing (not
    every round), counted in the metrics and listed by the API; the others'
    samples are kept all the same.
    """

    name = "dynomite-stats"
    claim: Claim = "lease"

    def __init__(
        self,
        config: Config,
        *,
        store: Store,
        metrics: ServiceMetrics,
        counters: Counter[str],
        evaluate_alerts: Callable[[], Awaitable[None]],
    ) -> None:
        self.config = config
        self.settings = config.settings
        self.interval_s = config.settings.probe_interval
        self.store = store
        self.metrics = metrics
        self.counters = counters
        self.evaluate_alerts = evaluate_alerts
        # The last collection (the samples themselves are in the store).
        self.collected_ns: int | None = None
        self.errors: dict[str, str] = {}

    async def run(self, fence: Fence | None = None) -> None:
        collection = await collect_dynomite_stats(
            self.settings.dynomite_stats_urls,
            store=None,
            timeout_s=self.settings.connect_timeout,
        )
        if fence is not None:
            await asyncio.to_thread(fence.confirm)  # a paused instance stores nothing
        if collection.samples:
            await asyncio.to_thread(record_stats, self.store, collection.samples)
        for url, error in collection.errors.items():
            if self.errors.get(url) != error:
                log.warning("Dynomite stats from %s: %s", url, error)
        for url in self.errors.keys() - collection.errors.keys():
            log.info("Dynomite stats from %s: answering again", url)
        self.errors = dict(collection.errors)
        self.collected_ns = time.time_ns()
        self.counters["dynomite samples"] += len(collection.samples)
        if collection.errors:
            self.counters["dynomite errors"] += len(collection.errors)
        self.metrics.observe_dynomite(
            samples=collection.samples, errors=collection.errors, finished_s=time.time()
        )
        await self.evaluate_alerts()

    def disown(self) -> None:
        """Another instance reads the nodes now: their figures are exported there."""
        self.metrics.dynomite.update(())

    def status(self) -> dict[str, Any]:
        """What `GET /api/v1/dynomite` returns: each configured node's latest stored sample,
        the last collection's errors, and nodes whose dropped peer requests grew within
        the window of the first `dynomite_dropped_writes` rule (5 minutes without one)."""
        urls = self.settings.dynomite_stats_urls
        latest = [s for s in recent_stats(self.store, limit=1) if s.node in urls]
        window_s = next(
            (r.over_s for r in self.config.alerts.rules if r.kind == "dynomite_dropped_writes"),
            300.0,
        )
        since_ns = time.time_ns() - int(window_s * 1e9)
        findings = dropped_writes_since(
            self.store, since_ns=since_ns, nodes=urls, stale_after_s=stale_after_s(self.settings)
        )
        return {
            "configured": len(urls),
            "interval_s": self.settings.probe_interval,
            "collected_ns": self.collected_ns,
            "window_s": window_s,
            "nodes": [s.to_dict() for s in sorted(latest, key=lambda s: (s.dc, s.rack, s.node))],
            "errors": [{"node": url, "error": error} for url, error in self.errors.items()],
            "dropped_writes": [f.to_dict() for f in findings if f.node in urls],
            "figures": [{"name": f.name, "help": f.help, "counter": f.counter} for f in FIGURES],
        }
