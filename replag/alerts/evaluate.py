"""Alert rules, their persisted states, and the hooks that notify people.

`evaluate_and_notify` is the one entry point: the service calls it after each
probe round and check, `replag probe --alerts` once per cron run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from replag.alerts.delivery import AlertSender, DeliveryResult
from replag.alerts.health import record_probe
from replag.alerts.rules import Condition, evaluate_rules
from replag.alerts.state import AlertBook, AlertEvent
from replag.config import Config
from replag.errors import LeaseLost, StoreUnwritable
from replag.lagindex import LagIndex
from replag.store import Store

if TYPE_CHECKING:
    from replag.alerts.delivery import Fence

log = logging.getLogger(__name__)

__all__ = [
    "AlertBook",
    "AlertEvent",
    "AlertOutcome",
    "AlertSender",
    "Condition",
    "DeliveryResult",
    "evaluate_and_notify",
    "sample_events",
]


class _ProbeReportLike(Protocol):
    run_id: str
    source: str
    unreachable: list[dict[str, str]]


@dataclass(kw_only=True)
class AlertOutcome:
    """What one evaluation did: the events it raised, and deliveries when it waited for them."""

    conditions: list[Condition] = field(default_factory=list)
    events: list[AlertEvent] = field(default_factory=list)
    deliveries: list[DeliveryResult] = field(default_factory=list)

    @property
    def firing(self) -> int:
        return sum(c.active for c in self.conditions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "active_conditions": self.firing,
            "events": [e.to_dict() for e in self.events],
            "deliveries": [d.to_dict() for d in self.deliveries],
        }


async def evaluate_and_notify(
    config: Config,
    store: Store,
    report: _ProbeReportLike | None = None,
    *,
    index: LagIndex | None = None,
    sender: AlertSender | None = None,
    now_ns: int | None = None,
    fence: Fence | None = None,
) -> AlertOutcome:
    """Evaluate every rule, move alert states, and notify the sinks.

    With `report` (a ProbeReport just taken), its unreachable replicas are recorded
    first. Without `sender`, a sender is made for this call and the deliveries are
    awaited (cron); with one, events are queued on it and this returns at once
    (the service, where a slow sink must not hold up probing).
    """
    if report is not None:
        record_probe(
            store,
            source=report.source,
            run_id=report.run_id,
            unreachable=list(report.unreachable),
            error=None,
        )
    now_ns = now_ns or time.time_ns()
    index = index or LagIndex(store)
    unknown: set[str] = set()
    conditions = evaluate_rules(config, index, now_ns=now_ns, unknown=unknown)
    book = AlertBook(store)
    if fence is not None and sender is not None and store.reachable:
        sender.retry_marks()
        # Decided and never sent: under an older epoch (an instance that died or lost its
        # lease before sending), or under this one by a send its fence stopped (the lease
        # lapsed a moment and was taken back). This owner sends them (at least once; the
        # notification id deduplicates), except those its sender still holds and those
        # still claimed by their sender (an owner that handed the lease over may be
        # sending them right now: adopted once its claim ran out, if it did not).
        try:
            pending = book.pending_outbox(through_epoch=fence.epoch)
            orphans = {i: e for i, e in pending if not sender.holds(e)}
            adopted = (
                book.adopt_outbox(
                    list(orphans), epoch=fence.epoch, claim_s=sender.claim_s, guard=fence.guard
                )
                if orphans
                else []
            )
        except (StoreUnwritable, LeaseLost):
            adopted = []  # the store went away, or the lease: adopted by the next owner
        if adopted:
            # Said, so that a notification a receiver got twice can be traced to a sender
            # that died or stalled before marking it (see docs/ha.md).
            log.info(
                "alert outbox: %d undelivered notifications adopted under epoch %d: %s",
                len(adopted),
                fence.epoch,
                ", ".join(orphans[i].notification_id for i in adopted),
            )
        sender.submit([orphans[i] for i in adopted], fence=fence)
    events = book.apply(
        conditions,
        now_ns=now_ns,
        repeat_interval_s=config.alerts.repeat_interval_s,
        send_resolved=config.alerts.send_resolved,
        guard=None if fence is None else fence.guard,
        epoch=0 if fence is None else fence.epoch,
        unknown_rules=unknown,
        claim_s=0.0 if sender is None else sender.claim_s,
    )
    outcome = AlertOutcome(conditions=conditions, events=events)
    # An Alertmanager lets an alert lapse at its endsAt: one run from cron posts again
    # what still fires (the service resends on its own schedule, `AlertSender.resend`).
    resend = sender is None and any(s.kind == "alertmanager" for s in config.alerts.sinks)
    if not events and not resend:
        return outcome
    if not config.alerts.sinks:
        book.mark_delivered(events, now_ns=time.time_ns())
        return outcome
    if sender is not None:
        sender.submit(events, fence=fence)
        return outcome
    own = AlertSender(config.alerts.sinks, store)
    try:
        outcome.deliveries = await own.deliver(events)
        if resend:
            sent = {e.fingerprint for e in events}
            again = [e for e in book.firing_events() if e.fingerprint not in sent]
            outcome.deliveries += await own.resend(again)
    finally:
        await own.close()
    if events:
        book.mark_delivered(events, now_ns=time.time_ns())
    return outcome


def sample_events(now_ns: int | None = None) -> list[AlertEvent]:
    """The alert `replag alerts test` sends: clearly a test, harmless to resolve."""
    now_ns = now_ns or time.time_ns()
    return [
        AlertEvent(
            fingerprint="replag-test",
            rule="ReplagTestAlert",
            status="firing",
            labels={"alertname": "ReplagTestAlert", "kind": "test", "severity": "info"},
            value=None,
            summary="Test notification from `replag alerts test`: hooks are wired.",
            starts_ns=now_ns,
            decided_ns=now_ns,
        )
    ]
