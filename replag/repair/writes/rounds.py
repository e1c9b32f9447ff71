"""The repair of one group's divergent keys, in rounds: verify, decide, write, re-verify.

Each round reads every pending key twice (`verify`); a key that agrees now is
`agreed`, one being written is left to the next round (after a pause that
grows), and each divergent one is decided (`decide`) and written by the
`Applier`. A key still moving after the last round is reported busy (or, in a
replication group whose replicas did not take the primary's write, resync).
A resumed run first reads again every key it had recorded as repaired.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from replag.repair.decisions import report as rp
from replag.repair.decisions.decide import GroupDecisions, KeyRecord
from replag.repair.decisions.policy import Decision
from replag.repair.trees.diff import Divergence
from replag.repair.writes.apply import Applier
from replag.repair.writes.guarded_write import Refused
from replag.repair.writes.verify import VERIFY_BATCH, Verifier

RECHECK_ROUNDS = 3


class RepairRounds:
    """The repair phase of one group's run, over the run's key records."""

    def __init__(
        self,
        *,
        records: dict[bytes, KeyRecord],
        update: Callable[[dict[bytes, KeyRecord]], None],
        verifier: Verifier,
        decisions: GroupDecisions,
        applier: Applier,
        report: rp.GroupReport,
    ) -> None:
        self.records, self._set = records, update
        self.verifier, self.decisions, self.applier = verifier, decisions, applier
        self.report = report

    async def reverify_repaired(self) -> int:
        """Read again every key recorded as repaired (one read per replica, digests
        compared); those that differ now are pending again. How many differ."""
        keys = sorted(k for k, r in self.records.items() if r.status == rp.REPAIRED)
        differ: dict[bytes, KeyRecord] = {}
        now_ms = time.time_ns() // 1_000_000
        for start in range(0, len(keys), VERIFY_BATCH):
            batch = keys[start : start + VERIFY_BATCH]
            reads = await self.verifier.observe_all(batch)
            for key in batch:
                states = [r[key] for r in reads]
                kind = self.verifier.classify(states, now_ms)
                if kind is not None or not all(s.readable for s in states):
                    found = Divergence(
                        key,
                        kind or "value",
                        dict(zip(self.decisions.names, states, strict=True)),
                        self.verifier.tolerance_ms,
                    )
                    differ[key] = KeyRecord(found.kind, rp.PENDING, self.decisions.detail(found))
        self._set(differ)
        self.report.reverified += len(keys)
        self.report.differed_again += len(differ)
        return len(differ)

    async def run(self) -> None:
        """Every pending key: verified again, decided, written, re-verified; a key that
        moved meanwhile is rechecked in a later round, and left busy after the last."""
        applier = self.applier
        todo = sorted(k for k, r in self.records.items() if r.status == rp.PENDING)
        for round_ in range(RECHECK_ROUNDS + 1):
            if not todo:
                break
            if round_:
                # Give writers a moment; a key still changing after the last round is busy.
                await asyncio.sleep(max(self.applier.settle_s * 4, 0.2) * round_)
            divergent, changing = await self.verifier.verify(todo, phase="repair")
            deferred = [key for key, _ in changing]
            found = {d.key for d in divergent}
            self._set(
                {
                    k: KeyRecord(self.records[k].kind, rp.AGREED, self.records[k].detail)
                    for k in todo
                    if k not in found and k not in deferred
                }
            )
            for start in range(0, len(divergent), VERIFY_BATCH):
                batch = divergent[start : start + VERIFY_BATCH]
                deferred += await self.resolve(batch, applier)
            todo = sorted(deferred)
        self.report.undone += applier.undone
        self.report.undo_failed += len(set(applier.undo_failed))
        settle_ms = applier.settle_s * 1000
        why = f"within repair_settle ({settle_ms:.0f} ms) in {RECHECK_ROUNDS + 1} rounds"
        self._set(
            {
                k: GroupDecisions.left_moving(self.records[k], applier.unfollowed.get(k), why)
                for k in todo
            }
        )
        # A copy a client changed in place before it could be undone: whatever later
        # rounds saw, the key needs a look.
        reason = "a client changed the repair's copy in place before it could be undone"
        self._set(
            {
                k: KeyRecord(
                    self.records[k].kind, rp.BUSY, {**self.records[k].detail, "reason": reason}
                )
                for k in set(applier.undo_failed)
            }
        )

    async def resolve(self, batch: Sequence[Divergence], applier: Applier) -> list[bytes]:
        """Decide and apply a batch of verified divergent keys; the keys that moved."""
        updates: dict[bytes, KeyRecord] = {}
        to_apply: list[tuple[Divergence, Decision]] = []
        for divergence in batch:
            decision = self.decisions.decide(divergence)
            if decision.action == "resync":
                updates[divergence.key] = self.decisions.record(
                    divergence, rp.RESYNC, decision.reason
                )
            elif decision.action == "conflict":
                updates[divergence.key] = self.decisions.record(
                    divergence, rp.CONFLICT, decision.reason
                )
            elif decision.action == "keep" or not decision.targets:
                updates[divergence.key] = self.decisions.record(
                    divergence, rp.KEPT, decision.reason
                )
            else:
                to_apply.append((divergence, decision))
        outcomes = await applier.apply_batch(
            [
                (d.key, decision, [d.states[name] for name in self.decisions.names])
                for d, decision in to_apply
            ]
        )
        moved: list[bytes] = []
        for (divergence, decision), outcome in zip(to_apply, outcomes, strict=True):
            if isinstance(outcome, Refused):
                # The key's error (READONLY, NOPERM, OOM…), named with the replica.
                updates[divergence.key] = self.decisions.record(divergence, rp.ERROR, str(outcome))
                continue
            if outcome == "changed":
                moved.append(divergence.key)
                continue
            status = rp.DRY_RUN if outcome == "dry_run" else rp.REPAIRED
            if status == rp.REPAIRED and decision.left:
                status = rp.RESYNC  # fixed where the primary's write reaches; not the rest
            updates[divergence.key] = self.decisions.record(
                divergence, status, decision.reason, decision
            )
        self._set(updates)
        return moved
