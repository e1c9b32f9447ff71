"""One replica group within one check or repair run.

Scan each member in a process of its own (`scan_process`: checkpointed, its
keys kept there), or reach its tree through its region's agent, walk the
Tictac trees from the root (`walk`), collect the keys of the differing leaves
that differ, verify them with two reads
`repair_settle` apart, record the divergent keys, then (repair only) decide
and write each key under WATCH, rechecking keys that were being written
instead of clobbering them. `engine` runs the groups and owns the run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from replag.errors import AgentError
from replag.repair.bulk.copy import (
    BULK_MIN,
    bulk_allowed,
    pending_log,
    refill_members,
    refill_plan,
    settle_members,
)
from replag.repair.bulk.rebuild_copy import RebuildOptions
from replag.repair.decisions import report as rp
from replag.repair.decisions.decide import GroupDecisions, KeyRecord
from replag.repair.decisions.findings import FINDINGS, per_replica
from replag.repair.decisions.policy import Policy
from replag.repair.decisions.report import key_finding
from replag.repair.decisions.roles import GroupShape, cluster_members
from replag.repair.keyspace.observe import key_to_json
from replag.repair.keyspace.progress import RepairProgress
from replag.repair.keyspace.slot_migrations import during_run, migration_rows
from replag.repair.keyspace.slots import (
    SLOTS,
    Move,
    SlotMap,
    key_slot,
    not_compared,
    ranges,
    stuck_moves,
)
from replag.repair.keyspace.together import cancel_all
from replag.repair.run_state import RunState
from replag.repair.scan.keep import batch_bytes, keep_limits
from replag.repair.scan.process import WorkerTree
from replag.repair.scan.scanner import ScanOptions, ScanProgress
from replag.repair.slot_counts import SlotCountCheck
from replag.repair.stray_slots import StrayCheck
from replag.repair.trees.diff import Divergence, differing_keys
from replag.repair.trees.remote import AgentClient, AgentReplica
from replag.repair.trees.tictac import DEFAULT_DEPTH, TictacTree
from replag.repair.trees.walk import AgentTree, MemberTree, differing_leaves, keys_in_batches
from replag.repair.wiped_member import find_wiped, refill_wiped
from replag.repair.writes.apply import Applier
from replag.repair.writes.lanes import ReplicaLane
from replag.repair.writes.rounds import RepairRounds
from replag.repair.writes.verify import Changing, Verifier
from replag.topology import ReplicaGroup
from replag.tracing import server, span
from replag.wire.reach import Reach

logger = logging.getLogger(__name__)


class GroupRun:
    """One group within one run."""

    def __init__(
        self, run: RunState, group: ReplicaGroup, policy: Policy, shape: GroupShape
    ) -> None:
        s, params = run.setup.settings, run.params
        self.topology = run.setup.topology
        # Where a server's answer may lead the run: the topology's hosts, allow_networks.
        self.reach = Reach.of(self.topology)
        self.rebuild = RebuildOptions.of(s)
        self.refill = self.rebuild.refill
        self.shape = shape
        group = replace(group, members=cluster_members(group, self.shape))
        self.group, self.params, self.policy, self.log = group, params, policy, run.log
        # A replication group's primary: the reference, and the only member written.
        self.primary = self.shape.primary if self.shape.kind == "replication" else None
        self.decisions = GroupDecisions(
            self.names,
            policy,
            self.shape,
            allow_deletes=params.allow_deletes,
            tolerance_ms=int(s.ttl_tolerance * 1000),
        )
        self.agent_wait_s = s.agent_wait
        self.progress, self.key_sink = run.progress, run.key_sink
        # Given keys (a rebuild's closing pass): verified and repaired, nothing scanned.
        self.given = list(run.keys) if run.keys is not None else None
        self.timeout_s = s.connect_timeout
        self.page_options, self.page_elements = self.refill.pages, s.repair_page_elements
        self.tolerance_ms = int(s.ttl_tolerance * 1000)
        self.settle_s = s.repair_settle
        self.scan_parallel = s.scan_parallel or len(group.members)
        self.options = ScanOptions(
            count=max(10, s.scan_count),
            timeout_s=self.timeout_s,
            match=params.match.encode() if params.match is not None else None,
            type_filter=params.type_filter,
            exclude_prefix=s.prefix.encode(),
            ttl_bucket_ms=max(self.tolerance_ms, 1),
            rate=s.scan_rate or None,
            checkpoint_every_s=s.scan_checkpoint,
            nice=s.scan_nice,
        )
        self.keep_limits = keep_limits(s.check_memory_mb, s.check_spill_mb, len(group.members))
        self.batch_bytes = batch_bytes(s.check_memory_mb, len(group.members))

        # Members whose region runs an agent are compared through it: their trees and key
        # reads stay in the region. A --match/--type check needs a filtered scan: direct.
        self.agents: list[AgentClient | None] = [
            run.agents.client_for(m) if not params.filtered else None for m in group.members
        ]
        self.stats = [
            rp.ReplicaStats(m.name, region=m.region, via="agent" if a is not None else "scan")
            for m, a in zip(group.members, self.agents, strict=True)
        ]
        # A member reached through its agent is also read and written there.
        self.lanes = [
            ReplicaLane(
                m,
                params.max_inflight,
                params.rate,
                s.repair_command_timeout,
                remote=AgentReplica(a, m.name) if a is not None else None,
            )
            for m, a in zip(group.members, self.agents, strict=True)
        ]
        self.compare_ttls = params.ttls != "ignore"
        if not self.compare_ttls and not any(self.agents):
            # Nothing reads TTLs. An agent's tree holds expiries: with one in the group,
            # the scans keep them too, or every expiring key would differ in the walk.
            self.options = replace(self.options, ttls="none")
        self.verifier = Verifier(
            group=group.name,
            names=self.names,
            lanes=self.lanes,
            agents=self.agents,
            policy=policy,
            settle_s=self.settle_s,
            chunk=self.options.count,
            tolerance_ms=self.tolerance_ms,
            compare_ttls=self.compare_ttls,
            progress=run.progress,
            not_compared=self._not_compared,
        )
        self.records: dict[bytes, KeyRecord] = {}
        self.report = rp.GroupReport(
            group.name,
            self.stats,
            kind=self.shape.kind,
            kind_why=self.shape.why,
            primary=group.members[self.primary].name if self.primary is not None else None,
            policy=policy.name if params.kind == "repair" else None,
        )

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.group.members]

    async def run(self) -> rp.GroupReport:
        with span(
            f"replag.{self.params.kind}.group",
            replag__group=self.group.name,
            replag__group_kind=self.shape.kind,
            replag__members=len(self.group.members),
        ):
            return await self._run()

    async def _run(self) -> rp.GroupReport:
        try:
            phase = self.log.group_phase(self.group.name) if self.log else None
            if phase is not None:
                self._restore(phase[1])
            if self.log is not None and self.params.kind == "repair":
                # Bulk batches a crash left unverified are settled before anything is read.
                await settle_members(self.refill.pages, self.group, self.log.store, self.log.run_id)
            if self.given is not None and phase is None:
                with span("replag.verify", replag__keys=len(self.given)):
                    await self._verify_given(self.given)
            elif phase is None and (left := await self._refill_wiped()) is not None:
                with span("replag.verify", replag__keys=len(left)):
                    await self._verify_given(left)
            elif phase is None or phase[0] == "scanning":
                with span("replag.scan_and_verify", replag__group=self.group.name):
                    await self._scan_and_verify()
            if self.params.kind == "repair":
                started = time.perf_counter()
                # A resumed run trusts nothing it recorded as repaired: a replica may have
                # restarted from an older snapshot since.
                rounds = self._rounds()
                differ = await rounds.reverify_repaired() if phase is not None else 0
                if phase is None or phase[0] != "done" or differ:
                    with span("replag.repair.rounds", replag__group=self.group.name):
                        await rounds.run()
                self.report.repair_s += time.perf_counter() - started
            self._save_phase("done")
        finally:
            for lane, stats in zip(self.lanes, self.stats, strict=True):
                stats.busy_s += lane.clock.seconds
                stats.writes += lane.writes
                stats.bytes_fetched += lane.bytes_received
                lane.clock.seconds, lane.writes, lane.bytes_received = 0.0, 0, 0
                await lane.close()
            for client, stats in zip(self.agents, self.stats, strict=True):
                if client is not None:
                    stats.bytes_fetched += client.take_bytes(stats.replica)
        self._summarise()
        return self.report

    # --- persistence --------------------------------------------------------

    def _restore(self, saved: dict[str, Any]) -> None:
        for row in saved.get("replicas", []):
            for stats in self.stats:
                if stats.replica == row["replica"]:
                    stats.keys_scanned, stats.scan_s = row["keys_scanned"], row["scan_s"]
                    stats.busy_s, stats.writes = row["busy_s"], row["writes"]
        self.report.candidates = saved.get("candidates", 0)
        self.report.bulk_refilled = saved.get("bulk_refilled", 0)
        self.report.changing = saved.get("changing_during_check", 0)
        self.report.not_compared = list(saved.get("not_compared", []))
        self.report.undone = saved.get("undone", 0)
        self.report.undo_failed = saved.get("undo_failed", 0)
        self.report.scan_s = saved.get("scan_s", 0.0)
        self.report.repair_s = saved.get("repair_s", 0.0)
        self.report.reverified = saved.get("reverified", 0)
        self.report.differed_again = saved.get("differed_again", 0)
        self.report.slots_not_compared = [
            (int(a), int(b)) for a, b in saved.get("slots_not_compared", [])
        ]
        assert self.log is not None
        for key, kind, status, detail in self.log.keys(self.group.name):
            self.records[key] = KeyRecord(kind, status, detail)
            if self.key_sink is not None and status == rp.FOUND:
                self.key_sink(self.group.name, key, detail)

    def _save_phase(self, phase: str) -> None:
        if self.log is None:
            return
        self._summarise()
        stats = self.report.to_dict()
        for lane, row in zip(self.lanes, stats["replicas"], strict=True):
            row["busy_s"] += lane.clock.seconds  # not yet folded in
            row["writes"] += lane.writes
        self.log.set_group_phase(self.group.name, phase, stats)

    def _set(self, updates: dict[bytes, KeyRecord]) -> None:
        self.records.update(updates)
        if self.log is not None and updates:
            self.log.add_keys(
                self.group.name, ((k, r.kind, r.status, r.detail) for k, r in updates.items())
            )

    def _summarise(self) -> None:
        counts = dict.fromkeys(self.report.counts, 0)
        found = dict.fromkeys(FINDINGS, 0)
        outcomes: dict[str, int] = {}
        shown: list[dict[str, Any]] = []
        for key, record in sorted(self.records.items()):
            counts[record.kind] = counts.get(record.kind, 0) + 1
            found[key_finding(record.kind, record.detail)] += 1
            outcomes[record.status] = outcomes.get(record.status, 0) + 1
            if len(shown) < rp.KEYS_SHOWN:
                shown.append({**record.detail, "status": record.status, **key_to_json(key)})
        if self.report.bulk_refilled:  # copied in bulk: missing keys, repaired, not listed
            counts["missing"] = counts.get("missing", 0) + self.report.bulk_refilled
            found["missing"] += self.report.bulk_refilled
            outcomes[rp.REPAIRED] = outcomes.get(rp.REPAIRED, 0) + self.report.bulk_refilled
        self.report.counts, self.report.outcomes, self.report.keys = counts, outcomes, shown
        self.report.found = found
        self.report.per_replica = per_replica(
            self.names, ((r.status, r.detail) for r in self.records.values())
        )

    # --- scan, diff, verify -------------------------------------------------

    async def _scan_and_verify(self) -> None:
        started = time.perf_counter()
        slots = asyncio.Semaphore(self.scan_parallel)
        # A Cluster shard's slots, to name those that move while it is checked.
        slot_map = await self._slot_map() if self.shape.cluster else None
        held: list[tuple[bytes, dict[str, Any]]] = []  # sink output held until then

        async def one(i: int) -> MemberTree:
            member, client = self.group.members[i], self.agents[i]
            if client is not None:
                return AgentTree(
                    member.name,
                    client,
                    depth=DEFAULT_DEPTH,
                    ttl_bucket_ms=self.options.ttl_bucket_ms,
                    wait_s=self.agent_wait_s,
                )
            async with slots:
                return await self._scan_member(i)

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(self.lanes))]
        try:
            trees = await asyncio.gather(*tasks)
            leaves = await differing_leaves(trees, DEFAULT_DEPTH)
            candidates, plan = await self._compare_leaves(trees, leaves)
        except AgentError as exc:
            raise self._not_compared(exc) from exc
        finally:
            # One member failing stops the others' scans; every scan process ends here.
            await cancel_all(tasks)
            scanned: list[WorkerTree] = []
            for task in tasks:
                if not task.cancelled() and task.exception() is None:
                    worker = task.result()
                    if isinstance(worker, WorkerTree):
                        worker.close()
                        scanned.append(worker)
            # Each finished scan's tree, saved once every scan process is gone (the store's
            # writes cost this process memory while they ran): a crash from here on, or
            # another member's failure, rescans none of them.
            for scan in scanned:
                if not scan.resumed and self.log is not None:
                    self.log.save_scan(self.group.name, scan.state, scan.tree)
        for tree, stats in zip(trees, self.stats, strict=True):
            if isinstance(tree, AgentTree):
                stats.keys_scanned = tree.keys
        del trees
        self.report.scan_s += time.perf_counter() - started
        self.report.candidates = len(candidates)
        if plan:
            candidates = await self._bulk(plan, candidates)
        await self._verify(candidates, held if slot_map is not None else None)
        if slot_map is not None:
            await self._settle_slots(slot_map)
            if self.key_sink is not None:
                for key, detail in held:
                    if key in self.records:
                        self.key_sink(self.group.name, key, detail)
        self._save_phase("diffed")
        if self.log is not None:
            self.log.drop_scans(self.group.name)

    async def _verify_given(self, keys: list[bytes]) -> None:
        """The given keys, verified as a scan's candidates are (no bulk path: the caller
        copied already)."""
        self.report.candidates = len(keys)
        await self._verify(keys, None)
        self._save_phase("diffed")

    async def _verify(
        self, candidates: list[bytes], held: list[tuple[bytes, dict[str, Any]]] | None
    ) -> None:
        """Verify `candidates` and record the divergent keys as each batch is verified;
        each goes to the key sink at once, or into `held` (a Cluster shard's: sent once
        its slots are known not to have moved meanwhile)."""
        status = rp.FOUND if self.params.kind == "check" else rp.PENDING

        def record(divergent: list[Divergence], changing: list[Changing]) -> None:
            self.report.changing += len(changing)
            if self.params.kind == "repair":
                # Being written, and differing when last read: the repair rounds recheck
                # them; one still moving after the last round is reported busy.
                divergent = divergent + [d for _, d in changing if d is not None]
            self._set(
                {d.key: KeyRecord(d.kind, status, self.decisions.detail(d)) for d in divergent}
            )
            if self.key_sink is not None:
                for d in divergent:
                    if held is not None:
                        held.append((d.key, self.decisions.detail(d)))
                    else:
                        self.key_sink(self.group.name, d.key, self.decisions.detail(d))

        self.report.changing = 0
        await self.verifier.verify(candidates, phase="verify", on_batch=record)
        self.report.not_compared = self.verifier.opaque_keys.to_list()

    async def _compare_leaves(
        self, trees: Sequence[MemberTree], leaves: npt.NDArray[np.int64]
    ) -> tuple[list[bytes], dict[int, list[bytes]]]:
        """The keys of `leaves` whose entries differ between members, and the bulk refill's
        plan, from the members' keys a batch of leaves at a time (within the budget)."""
        candidates: list[bytes] = []
        plan: dict[int, list[bytes]] = {}
        bulk = self._bulk_possible()
        batches = 0
        async for parts in keys_in_batches(trees, leaves, DEFAULT_DEPTH, self.batch_bytes):
            batches += 1
            candidates += differing_keys(parts)
            for t, keys in (refill_plan(parts) if bulk else {}).items():
                plan.setdefault(t, []).extend(keys)
        logger.info(
            "group %s: the keys of %d differing leaves compared in %d batch(es) of at most "
            "%d bytes",
            self.group.name,
            len(leaves),
            batches,
            self.batch_bytes,
        )
        return sorted(candidates), {t: sorted(keys) for t, keys in plan.items()}

    def _bulk_possible(self) -> bool:
        """A repair that writes, every member reached directly, a policy that copies; never
        in a replication group (a bulk refill writes the member that lacks keys: a replica)."""
        p = self.params
        return (
            p.kind == "repair"
            and not p.dry_run
            and not any(self.agents)
            and self.shape.kind != "replication"
        )

    async def _bulk(self, plan: dict[int, list[bytes]], candidates: list[bytes]) -> list[bytes]:
        """Members lacking many keys their peers agree on are refilled in bulk first
        (`bulk`); the candidates left for the key-by-key path."""
        n = len(self.group.members)
        plan = {
            t: keys
            for t, keys in plan.items()
            if bulk_allowed(self.policy, t, n, allow_deletes=self.params.allow_deletes)
        }
        if not any(len(keys) >= BULK_MIN for keys in plan.values()):
            return candidates
        if self.log is not None:
            self.log.drop_scans(self.group.name)  # a crash from here rescans: the copies show
        stood = await refill_members(
            self.refill,
            self.group,
            plan,
            rate=self.params.rate,
            store=self.log.store if self.log is not None else None,
            run_id=self.log.run_id if self.log is not None else None,
            progress=self.progress,
        )
        copied: set[bytes] = set()
        for t, keys in stood.items():
            self.stats[t].writes += len(keys)
            copied |= keys
        self.report.bulk_refilled += len(copied)
        return [k for k in candidates if k not in copied]

    async def _refill_wiped(self) -> list[bytes] | None:
        """A member found wiped or nearly empty is refilled the rebuild's way before anything
        is scanned (`wiped_member`); the keys left to verify, None: scan every member."""
        if not self._bulk_possible() or self.params.filtered:
            return None
        wiped = await find_wiped(
            self.group,
            self.policy,
            allow_deletes=self.params.allow_deletes,
            timeout_s=self.timeout_s,
        )
        if wiped is None:
            return None
        target = self.group.members[wiped.index]
        log = (
            pending_log(self.log.store, self.log.run_id, self.group.name, target.name)
            if self.log is not None
            else None
        )
        done = await refill_wiped(
            self.rebuild, self.group, wiped, rate=self.params.rate, log=log, progress=self.progress
        )
        self.report.bulk_refilled += done.copied
        self.report.scan_s += done.seconds
        self.stats[wiped.index].writes += done.copied
        for stats in self.stats:
            if stats.replica == done.source:
                stats.keys_scanned, stats.scan_s = done.read, done.seconds
        return done.left

    async def _slot_map(self) -> SlotMap:
        return await SlotMap.read(self.group.members, timeout_s=self.timeout_s, reach=self.reach)

    async def _settle_slots(self, before: SlotMap) -> None:
        """What the run's slot maps say, at its end: the slots not compared (moved or
        moving), stale marks, stuck moves, stray keys, a topology that changed (then
        nothing of the group is reported), and the reads refused (then not verified)."""
        after = await self._slot_map()
        report = self.report
        report.refused += before.refused + after.refused
        report.slot_migrations = migration_rows(
            during_run(before.migrations, after.migrations), {**before.where, **after.where}
        )
        changed = before.topology_change() or after.topology_change()
        if changed is not None:
            report.topology_changed = changed
            self._forget_slots(set(range(SLOTS)))
            return
        skipped = not_compared(before, after) | self.verifier.moved_slots
        stuck = {s: m for s, m in stuck_moves(before, after).items() if s not in skipped}
        report.stuck_moves = _stuck_rows(stuck, after)
        # Keys members hold in slots the shard serves at neither end (a reshard's
        # leftovers on a replica): not in the scan, and no repair through the primary.
        strays = StrayCheck(
            self.topology,
            [m for m, a in zip(self.group.members, self.agents, strict=True) if a is None],
            self.group.members[self.primary] if self.primary is not None else None,
            timeout_s=self.timeout_s,
            settle_s=self.settle_s,
            read_map=self._slot_map,
        )
        # Keys a stuck move took across are not strays.
        report.stray_keys = await strays.find(before.owned | after.owned, skipped | stuck.keys())
        report.refused += strays.refused
        await self._compare_slot_counts(skipped | stuck.keys())
        if after.stale and not strays.maps:
            await asyncio.sleep(self.settle_s)
            strays.maps.append(await self._slot_map())
            report.refused += strays.maps[-1].refused
        # A mark is stale only if it still is at a later read: a live move's two ends are
        # marked one after the other, and cleared one after the other.
        stale: dict[str, set[int]] = {}
        for slot, node in after.stale.items():
            if slot not in skipped and all(m.stale.get(slot) == node for m in strays.maps):
                stale.setdefault(node, set()).add(slot)
        report.stale_marks = [
            {"node": node, "slots": [list(r) for r in ranges(slots)]}
            for node, slots in sorted(stale.items())
        ]
        self._forget_slots(skipped)

    async def _compare_slot_counts(self, skipped: set[int]) -> None:
        """Each replica's key count per slot against its primary's (`slot_counts`): named
        differences beside the check's own findings, never findings themselves."""
        if self.primary is None:
            return
        replicas = [
            m
            for i, (m, a) in enumerate(zip(self.group.members, self.agents, strict=True))
            if a is None and i != self.primary
        ]
        if not replicas or self.agents[self.primary] is not None:
            return
        counts = SlotCountCheck(
            self.group.members[self.primary], replicas, timeout_s=self.timeout_s
        )
        self.report.slot_counts = await counts.compare(skipped)
        self.report.slot_counts_missing = counts.missing

    def _forget_slots(self, skipped: set[int]) -> None:
        """Keys of slots that moved during the check were not compared: drop what was
        found in them (never a false positive) and name the slots instead."""
        self.report.slots_not_compared = ranges(skipped)
        if not skipped:
            return
        dropped = [k for k in self.records if key_slot(k) in skipped]
        for key in dropped:
            del self.records[key]
        if self.log is not None and dropped:
            self.log.drop_keys(self.group.name, dropped)

    def _not_compared(self, exc: AgentError) -> AgentError:
        """The agent's failure, naming the members it left uncompared."""
        lost = [
            m.name
            for m, client in zip(self.group.members, self.agents, strict=True)
            if client is not None and client.url == exc.where
        ]
        names = ", ".join(lost) or "its replicas"
        return AgentError(
            f"{exc.message}; could not compare {names} (group {self.group.name})", where=exc.where
        )

    async def _scan_member(self, i: int) -> WorkerTree:
        member = self.group.members[i]
        state, saved = ScanProgress(member.name), None
        log = self.log
        if log is not None:
            state, saved = log.load_scan(self.group.name, member.name)

        def checkpoint(progress: ScanProgress, tree: TictacTree) -> None:
            if log is not None:
                log.save_scan(self.group.name, progress, tree)

        with (
            span(
                "replag.scan.member",
                replag__replica=member.name,
                **server(member.host, member.port),
            ),
            self.lanes[i].clock.busy(),
        ):
            worker = await WorkerTree.scan(
                member,
                self.options,
                state,
                saved,
                depth=DEFAULT_DEPTH,
                progress=self._scan_progress,
                checkpoint=checkpoint,
                limits=self.keep_limits,
            )
        self.stats[i].bytes_fetched += worker.bytes_received
        self.stats[i].keys_scanned, self.stats[i].scan_s = state.keys, state.seconds
        return worker

    def _scan_progress(self, state: ScanProgress) -> None:
        if self.progress is not None:
            rate = state.keys / state.seconds if state.seconds > 0 else 0.0
            self.progress(
                RepairProgress(
                    self.group.name, state.replica, "scan", state.keys, state.total, rate
                )
            )

    def _rounds(self) -> RepairRounds:
        applier = Applier(
            self.lanes,
            tolerance_ms=self.tolerance_ms,
            settle_s=self.settle_s,
            dry_run=self.params.dry_run,
            chunk=self.options.count,
            pages=self.page_options,
            page_elements=self.page_elements,
        )
        return RepairRounds(
            records=self.records,
            update=self._set,
            verifier=self.verifier,
            decisions=self.decisions,
            applier=applier,
            report=self.report,
        )


def _stuck_rows(stuck: dict[int, Move], after: SlotMap) -> list[dict[str, Any]]:
    """Stuck moves by their two ends: the slots, and the keys each end holds in them."""
    by_ends: dict[Move, list[int]] = {}
    for slot, move in stuck.items():
        by_ends.setdefault(move, []).append(slot)
    return [
        {
            "migrating": move.migrating,
            "importing": move.importing,
            "slots": [list(r) for r in ranges(slots)],
            "keys_migrating": sum(after.keys.get((move.source_id, s), 0) for s in slots),
            "keys_importing": sum(after.keys.get((move.target_id, s), 0) for s in slots),
        }
        for move, slots in sorted(by_ends.items(), key=lambda item: min(item[1]))
    ]
