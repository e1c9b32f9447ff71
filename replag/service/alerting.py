"""Alert evaluation: rules over what the store and the index hold, state changes sent out.

A unit of its own (`alerts`, leased): one instance evaluates at a time, every
`probe_interval`, and also when one of its own rounds ends (`after_round`), so
the rules see the round that just ended. Several instances never decide the
same change twice (the state changes are compare-and-set, written with their
outbox row in one transaction, see `replag.alerts.state`), and only the holder
of the lease sends (its fence is checked before each notification).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence

from replag.alerts.evaluate import (
    AlertBook,
    AlertEvent,
    AlertSender,
    DeliveryResult,
    evaluate_and_notify,
)
from replag.config import Config
from replag.errors import StoreError
from replag.lagindex import LagIndex
from replag.metrics import ServiceMetrics
from replag.service.leasing import Fence, LeaseKeeper
from replag.service.scheduler import Claim
from replag.store import Store

log = logging.getLogger("replag.service")


class AlertEvaluation:
    """Evaluates every rule and queues the state changes on the sender."""

    name = "alerts"
    claim: Claim = "lease"

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
        self.interval_s = config.settings.probe_interval
        self.store = store
        self.index = index
        self.metrics = metrics
        self.counters = counters
        self.keeper: LeaseKeeper | None = None  # set while several instances may run
        self.book = AlertBook(store)
        self.sender = AlertSender(
            config.alerts.sinks,
            store,
            external_url=external_url,
            on_result=self._count_delivery,
            on_delivered=self._delivered,
        )

    def reconfigure(self, config: Config) -> None:
        """Evaluate `config`'s rules and send to its sinks from the next evaluation on (the
        alert state, in the store, carries on)."""
        self.config = config
        self.interval_s = config.settings.probe_interval
        self.sender.sinks = tuple(config.alerts.sinks)

    async def run(self, fence: Fence | None = None) -> None:
        await self.evaluate(fence)

    async def after_round(self) -> None:
        """Evaluate now if this instance owns the evaluation (or nothing is leased)."""
        if self.keeper is None:
            await self.evaluate()
            return
        fence = self.keeper.fence(self.name)
        if fence is not None:
            await self.evaluate(fence)

    async def evaluate(self, fence: Fence | None = None) -> None:
        # Queries skip picking up new windows while the store is busy; rules must see the
        # round that just ended, so wait for it here (in a thread: the store may be busy).
        await asyncio.to_thread(self.index.refresh)
        outcome = await evaluate_and_notify(
            self.config, self.store, index=self.index, sender=self.sender, fence=fence
        )
        self.counters["alert notifications"] += len(outcome.events)
        self.metrics.alerts_firing.set(self.book.firing_count())

    def _delivered(self, events: Sequence[AlertEvent]) -> bool:
        """Mark `events` delivered; False (marked again at the next evaluation, or, should
        this instance stop first, sent again by the next owner: at least once) when the
        store could not take the mark."""
        try:
            return self.book.mark_delivered(events, now_ns=time.time_ns())
        except StoreError as exc:
            log.warning("alert outbox: delivered notifications not marked yet (%s)", exc)
            return False

    def disown(self) -> None:
        """This instance stopped evaluating: the owner exports the firing count."""
        self.metrics.alerts_firing.set(0)

    def _count_delivery(self, result: DeliveryResult) -> None:
        self.metrics.alert_deliveries.labels(result.sink, "ok" if result.ok else "failed").inc()
