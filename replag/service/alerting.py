"""Alert evaluation: rules over what the store and the index hold, state changes sent out.

Every scheduled unit asks for an evaluation when its round ends (`evaluate`), so
the rules see the round that just ended; the sender delivers in the background.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from replag.alerts.evaluate import AlertBook, AlertSender, DeliveryResult, evaluate_and_notify
from replag.config import Config
from replag.lagindex import LagIndex
from replag.metrics import ServiceMetrics
from replag.store import Store


class AlertEvaluation:
    """Evaluates every rule and queues the state changes on the sender."""

    def __init__(
        self,
        config: Config,
        *,
        store: Store,
        index: LagIndex,
        metrics: ServiceMetrics,
        counters: Counter[str],
        external_url: str = "",
    ) -> None:
        self.config = config
        self.store = store
        self.index = index
        self.metrics = metrics
        self.counters = counters
        self.book = AlertBook(store)
        self.sender = AlertSender(
            config.alerts.sinks, store, external_url=external_url, on_result=self._count_delivery
        )

    async def evaluate(self) -> None:
        # Queries skip picking up new windows while the store is busy; rules must see the
        # round that just ended, so wait for it here (in a thread: the store may be busy).
        await asyncio.to_thread(self.index.refresh)
        outcome = await evaluate_and_notify(
            self.config, self.store, index=self.index, sender=self.sender
        )
        self.counters["alert notifications"] += len(outcome.events)
        self.metrics.alerts_firing.set(self.book.firing_count())

    def _count_delivery(self, result: DeliveryResult) -> None:
        self.metrics.alert_deliveries.labels(result.sink, "ok" if result.ok else "failed").inc()
