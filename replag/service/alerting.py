"""Alert evaluation: rules over what the store and the index hold, state changes sent out.

A unit of its own (`alerts`, leased): one instance evaluates at a time, every
`probe_interval`, and also when one of its own rounds ends (`after_round`), so
the rules see the round that just ended. Several instances never decide the
same change twice (the state changes are compare-and-set, written with their
outbox row in one transaction, see `replag.alerts.state`), and only the holder
of the lease sends (its fence is checked before each notification).

**While the store cannot be reached** the evaluator cannot see what the other
instances measure (the store is how it sees it), so each instance evaluates the
rules on what its own units measure (`probe:SOURCE`: the lag, loss and
reachability rules of that source; `replication`: the replication rules) and
notifies those changes itself; every other alert stays as it is. Each unit has
one owner while nobody can take a lease, so each change is still decided once;
the states and outbox rows are held and written when the store is back, where
the evaluator carries on from them. Rules that only the store can answer
(divergence, Dynomite's dropped writes) wait for it.

**When the store answers again** the evaluator waits until what was held
meanwhile is stored before it reads the store again: its own held writes, and
every other instance's that was live when the store went away. Each instance
marks in the store, on the database's clock, when it holds nothing
(`replag.store.held_marks`, at every heartbeat); the evaluator waits for a mark
newer than its own first look after the store's return from each of them (or
for its `instance:` lease to have expired a lease time after the return: it
died, and what it held is lost). Until then the alerts keep their states: an
alert another instance decided and sent from memory during the outage is not
yet in the store, and evaluating without it would notify it again (a second
"firing"); a window whose probes are still held elsewhere would read as no
data or as the wrong ratio, resolving an alert the outage did not end. An
instance that stays cut off (or a store that refuses its writes for another
reason) is waited for at most `SETTLE_CAP_LEASES` lease times; alerting then
goes on as it does without the store's view of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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
from replag.alerts.rules import evaluate_rules
from replag.config import Config
from replag.errors import StoreError
from replag.lagindex import LagIndex
from replag.metrics import ServiceMetrics
from replag.service.leasing import Fence, LeaseKeeper
from replag.service.scheduler import Claim
from replag.store import Store, held_marks, leases
from replag.store.leases import INSTANCE_PREFIX

log = logging.getLogger("replag.service")

# After the store answers again, the longest wait (in lease times, at least a minute)
# for the other instances to say they hold nothing: one still cut off, or whose writes
# the store refuses, is not waited for longer.
SETTLE_CAP_LEASES = 3
SETTLE_CAP_MIN_S = 60.0


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
        self._state_read = 0.0  # monotonic: when a non-evaluator last read the alert states
        self._held_for: str | None = None  # why evaluation waits now (logged once)
        # The database's clock at this instance's first look after the store's last return
        # (by when it returned, monotonic): the others' marks must be newer.
        self._back_db_ns: tuple[float, int] | None = None
        self._settled_for: float | None = None  # the return after which it was settled
        self.book = AlertBook(store)
        self.sender = AlertSender(
            config.alerts.sinks,
            store,
            external_url=external_url,
            on_result=self._count_delivery,
            on_delivered=self._delivered,
            outbox=self.book,
        )
        self.sender.min_valid_s = 4 * self.interval_s

    def reconfigure(self, config: Config) -> None:
        """Evaluate `config`'s rules and send to its sinks from the next evaluation on (the
        alert state, in the store, carries on)."""
        self.config = config
        self.interval_s = config.settings.probe_interval
        self.sender.sinks = tuple(config.alerts.sinks)
        self.sender.min_valid_s = 4 * self.interval_s

    async def run(self, fence: Fence | None = None) -> None:
        if self.keeper is not None and not self.store.reachable:
            await self.evaluate_own(self.keeper)
            return
        await self.evaluate(fence)

    async def after_round(self) -> None:
        """Evaluate now if this instance owns the evaluation (or nothing is leased); while
        the store is away, what its own units measure (see the module docstring)."""
        if self.keeper is None:
            await self.evaluate()
            return
        if not self.store.reachable:
            await self.evaluate_own(self.keeper)
            return
        fence = self.keeper.fence(self.name)
        if fence is not None:
            await self.evaluate(fence)
        else:
            # Not the evaluator: read the alert states now and then, so that an outage
            # finds them known here (evaluate_own starts from them).
            now = time.monotonic()
            if now - self._state_read >= self.interval_s:
                self._state_read = now
                try:
                    await asyncio.to_thread(self.book.active)
                except StoreError as exc:
                    log.debug("alert states not read: %s", exc)

    async def evaluate_own(self, keeper: LeaseKeeper) -> None:
        """The store is away: evaluate the rules on what this instance's units measure, and
        notify those changes (held for the store; see the module docstring)."""
        owned = set(keeper.held_names())
        if not owned:
            return
        kinds = {rule.name: rule.kind for rule in self.config.alerts.rules}

        def mine(kind: str, labels: dict[str, str]) -> bool:
            return unit_of(kind, labels) in owned

        with contextlib.suppress(StoreError):  # the index serves what was measured here
            await asyncio.to_thread(self.index.refresh)
        now_ns = time.time_ns()
        conditions = evaluate_rules(self.config, self.index, now_ns=now_ns, unknown=set())
        conditions = [c for c in conditions if mine(c.rule.kind, c.labels)]
        try:
            events = await asyncio.to_thread(
                self.book.apply,
                conditions,
                now_ns=now_ns,
                repeat_interval_s=self.config.alerts.repeat_interval_s,
                send_resolved=self.config.alerts.send_resolved,
                keep=lambda row: (
                    not mine(kinds.get(row["rule"], ""), json.loads(row["labels_json"]))
                ),
                claim_s=self.sender.claim_s,
            )
        except StoreError as exc:
            log.warning("alerts: not evaluated while the store is away (%s)", exc)
            return
        if events:
            self.counters["alert notifications"] += len(events)
            if self.config.alerts.sinks:
                self.sender.submit(events)
            else:
                self.book.mark_delivered(events, now_ns=time.time_ns())

    def unsettled(self, keeper: LeaseKeeper) -> str | None:
        """Why the store cannot yet hold everything made during an outage that ended (see
        the module docstring); None when it can. Blocking (store reads)."""
        health = self.store.health
        back = health.reachable_again_mono
        if back is None or not health.reachable or back == self._settled_for:
            return None
        waited = time.monotonic() - back
        if waited >= max(SETTLE_CAP_MIN_S, SETTLE_CAP_LEASES * keeper.ttl_s):
            return None  # alerting goes on as it does without the others' view
        if not held_marks.nothing_held(self.store):
            return "this instance's held writes are not all stored yet"
        if not keeper.peers_when_away:
            return None
        try:
            if self._back_db_ns is None or self._back_db_ns[0] != back:
                self._back_db_ns = (back, held_marks.database_now(self.store))
            since_ns = self._back_db_ns[1]
            marks = held_marks.marks(self.store)
            live = {x.holder for x in leases.current(self.store, prefix=INSTANCE_PREFIX)}
        except StoreError as exc:
            return f"the store does not answer yet ({exc})"
        waiting = sorted(
            peer
            for peer in keeper.peers_when_away
            if marks.get(peer, 0) <= since_ns and (peer in live or waited < keeper.ttl_s)
        )
        if waiting:
            return (
                f"{len(waiting)} other instances may still be storing what they held "
                f"({', '.join(waiting)})"
            )
        self._settled_for = back
        return None

    async def evaluate(self, fence: Fence | None = None) -> None:
        if self.keeper is not None:
            why = await asyncio.to_thread(self.unsettled, self.keeper)
            if why != self._held_for:
                self._held_for = why
                if why is not None:
                    log.info("alerts: states kept until the store is settled: %s", why)
            if why is not None:
                return
        # Queries skip picking up new windows while the store is busy; rules must see the
        # round that just ended, so wait for it here (in a thread: the store may be busy).
        await asyncio.to_thread(self.index.refresh)
        outcome = await evaluate_and_notify(
            self.config, self.store, index=self.index, sender=self.sender, fence=fence
        )
        self.counters["alert notifications"] += len(outcome.events)
        self.metrics.alerts_firing.set(self.book.firing_count())
        # Alertmanager sinks are told again what still fires (within their `resend`).
        if any(s.kind == "alertmanager" for s in self.sender.sinks):
            self.sender.resend_soon(self.book.firing_events(), fence=fence)

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


# Alert rule kinds by the unit whose measurements they judge (the rest read the store).
_PROBE_KINDS = ("lag_p99", "probe_loss", "unreachable", "no_probe")
_REPLICATION_KINDS = ("replication_", "failover_")


def unit_of(kind: str, labels: dict[str, str]) -> str | None:
    """The unit whose measurements an alert of `kind` on `labels` judges; None for the
    kinds that read the store only (divergence, Dynomite's dropped writes)."""
    if kind in _PROBE_KINDS and "source" in labels:
        return f"probe:{labels['source']}"
    if kind.startswith(_REPLICATION_KINDS):
        return "replication"
    return None
