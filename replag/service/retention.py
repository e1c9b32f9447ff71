"""Retention: compact old lag windows and prune every table to `retention` (hourly)."""

from __future__ import annotations

import asyncio
import logging
import time

from replag.alerts.state import AlertBook
from replag.lagindex import LagIndex
from replag.monitoring.dynomite_stats import prune_stats
from replag.replication import history as replication_history
from replag.service.leasing import Fence
from replag.service.scheduler import Claim
from replag.settings import Settings
from replag.store import Store

log = logging.getLogger("replag.service")


class RetentionRound:
    """Compacts windows older than `compact_after`, drops rows older than `retention`."""

    name = "retention"
    claim: Claim = "slot"
    interval_s = 3600.0

    def __init__(
        self, settings: Settings, *, store: Store, index: LagIndex, alert_book: AlertBook
    ) -> None:
        self.settings = settings
        self.store = store
        self.index = index
        self.alert_book = alert_book

    async def run(self, fence: Fence | None = None) -> None:
        """Compact old windows, and keep the store (and the in-memory index) to `retention`."""
        now = time.time_ns()
        merged, written, removed = await asyncio.to_thread(
            self.store.compact,
            older_than_ns=now - int(self.settings.compact_after * 1e9),
            window_ns=max(1, int(self.settings.window * 1e9)),
        )
        if merged:
            self.index.forget_ids(removed)
            log.info("compaction: %d lag windows merged into %d", merged, written)
        cutoff = now - int(self.settings.retention * 1e9)
        deleted = await asyncio.to_thread(self.store.prune, cutoff)
        deleted["dynomite_stats"] = await asyncio.to_thread(prune_stats, self.store, cutoff)
        deleted["alert_events"] = await asyncio.to_thread(self.alert_book.prune_events, cutoff)
        deleted |= await asyncio.to_thread(replication_history.prune, self.store, cutoff)
        await asyncio.to_thread(
            replication_history.thin,
            self.store,
            older_than_ns=now - int(self.settings.compact_after * 1e9),
            window_ns=max(1, int(self.settings.window * 1e9)),
        )
        forgotten = self.index.forget_before(cutoff)
        if any(deleted.values()):
            log.info(
                "retention: pruned %s; %d windows dropped from the index",
                ", ".join(f"{n} {t}" for t, n in deleted.items() if n),
                forgotten,
            )
