"""A verified divergent key, decided as the group's kind says, and recorded for the report.

The policy decides what the members should hold; in a replication group the
decision is carried out through the primary (`policy.through_primary`), or is
a resync where nothing the primary writes reaches the members that differ.
Each key's record keeps what every member held, what differs where
(`findings`), and the decision's plan per member, which the per-replica report
counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replag.repair.decisions import report as rp
from replag.repair.decisions.findings import findings, plan
from replag.repair.decisions.policy import Decision, Policy, Source, through_primary
from replag.repair.decisions.roles import GroupShape
from replag.repair.keyspace.observe import KeyState
from replag.repair.trees.diff import Divergence


@dataclass
class KeyRecord:
    """One divergent key of a run: its kind, its status (`report` outcomes), its detail."""

    kind: str
    status: str
    detail: dict[str, Any]


class GroupDecisions:
    """Decisions and records for the keys of one group."""

    def __init__(
        self,
        names: list[str],
        policy: Policy,
        shape: GroupShape,
        *,
        allow_deletes: bool,
        tolerance_ms: int,
    ) -> None:
        self.names, self.policy, self.shape = names, policy, shape
        self.allow_deletes, self.tolerance_ms = allow_deletes, tolerance_ms
        # A replication group's primary: the reference, and the only member written.
        self.primary = shape.primary if shape.kind == "replication" else None

    def decide(self, divergence: Divergence) -> Decision:
        """The policy's decision, as the group's kind carries it out."""
        states = [divergence.states[name] for name in self.names]
        if self.shape.no_primary is not None:
            return Decision("resync", reason=f"not repaired: {self.shape.no_primary}")
        decision: Decision = self.policy.decide(
            states, allow_deletes=self.allow_deletes, tolerance_ms=self.tolerance_ms
        )
        if self.primary is None:
            return self._unknown_winner(decision, states) or decision
        return through_primary(
            decision,
            states,
            primary=self.primary,
            unfollowing=self.shape.unfollowing,
            names=self.names,
        )

    def _unknown_winner(self, decision: Decision, states: list[KeyState]) -> Decision | None:
        """A conflict where a peer group's policy would copy a value replag cannot read
        (a module type) that more than one member holds: which of them is right (or
        whether they agree) is not known, so none is copied. A configured source is
        trusted as it is for any type; a replication group's primary is the truth."""
        if decision.action != "copy" or decision.winner is None or isinstance(self.policy, Source):
            return None
        winner = states[decision.winner]
        holders = [s for s in states if s.exists and s.opaque is not None]
        restores = any(not states[t].same_value(winner) for t in decision.targets)
        if winner.opaque is None or len(holders) < 2 or not restores:
            return None  # (a member holding the value already gets its expiry only)
        return Decision(
            "conflict",
            reason=(
                f"{len(holders)} members hold a {winner.type} value, which replag cannot "
                "compare: which one is right is not known (--policy source:NAME copies "
                "the source's to members that lack the key)"
            ),
        )

    def detail(self, divergence: Divergence) -> dict[str, Any]:
        """The key's record: its states, and per member what differs there (`findings`)."""
        states = [divergence.states[name] for name in self.names]
        found = findings(self.names, states, self.primary, self.tolerance_ms)
        return {**divergence.to_dict(), "findings": found}

    def record(
        self,
        divergence: Divergence,
        status: str,
        reason: str = "",
        decision: Decision | None = None,
    ) -> KeyRecord:
        detail = self.detail(divergence)
        if reason:
            detail["reason"] = reason
        if decision is not None:
            detail["plan"] = plan(self.names, decision)
            if decision.via is not None:
                detail["via"] = self.names[decision.via]
        return KeyRecord(divergence.kind, status, detail)

    @staticmethod
    def left_moving(record: KeyRecord, behind: list[str] | None, why: str) -> KeyRecord:
        """A key still divergent after the last round: busy (clients kept writing it), or,
        where its primary held what was written and replicas (`behind`) did not, left
        for a resync (`why` says how long they were given)."""
        if not behind:
            return KeyRecord(record.kind, rp.BUSY, record.detail)
        reason = (
            f"{', '.join(behind)} did not take the primary's write {why}: lagging more "
            "than that, or not applying the stream; a resync fixes it"
        )
        return KeyRecord(record.kind, rp.RESYNC, {**record.detail, "reason": reason})
