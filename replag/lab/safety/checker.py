"""The checker: what every replica should hold, from the history, against what it holds.

For each key and replica, the operations the writers applied there (in version
order, which is the order they were applied in) decide what must be true at
the end, whatever repair did in between:

- every element written there after the last DEL must be there, with that
  version or a newer one (a write dropped on this replica and copied in by
  repair): missing is a **lost** write, an older version is **clobbered**;
- nothing older than the last DEL may be there: that is **resurrected**;
- the expiry must be one decided by the replica's own last expiry-deciding
  operation (DEL, string SET, creating write, PEXPIREAT that found the key)
  or by a later one on any replica: none is a lost write, an older one clobbered.

Writes are dropped (on one replica, never a DEL) only before the repair starts,
so all the divergence exists before the scan.

Keys the writers never touched are judged only by agreement: at the end a key
the replicas still disagree on must have been reported as left (conflict,
busy, kept); one the run counted as repaired or agreed, or did not mention, is
**falsely fixed**.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from replag.lab.safety.model import ABSENT, Held, Keyspace, write_command
from replag.lab.safety.workload import DELETE, EXPIRE, WRITE, Op

# Outcomes after which replicas may still differ: the run said so.
REPORTED_LEFT = frozenset({"conflict", "busy", "kept", "would_repair"})
CATEGORIES = ("clobbered", "resurrected", "lost", "falsely_fixed")


@dataclass
class Verdict:
    """Counts of keys per anomaly and a few examples of each."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    examples: list[str] = field(default_factory=list)
    left_reported: int = 0  # divergent at the end, and the run said so
    # Anomalous keys where an operation slower than the repair's bound was still fanning
    # out while the repair read or wrote that key: the assumption failed there.
    outside_bound: int = 0
    slow_during_repair: int = 0  # slow operations the repair met so (anomalous or not)

    def example(self, category: str, key: bytes, text: str) -> None:
        if len(self.examples) < 12:
            self.examples.append(f"{category}: {key.decode(errors='replace')}: {text}")

    @property
    def clean(self) -> bool:
        return not any(self.counts.values())


@dataclass
class _Expected:
    """What the operations applied on one replica oblige it to hold."""

    last_delete: int | None = None
    written: dict[bytes, int] = field(default_factory=dict)  # since the last DEL
    ttl_event: int | None = None  # version of the last op that decided the expiry here


# (version, expiry it leaves: None or the PEXPIREAT's version) per expiry-deciding op.
TtlEvent = tuple[int, int | None]


def expected_on(
    kind: str, ops: Iterable[tuple[Op, int | str | None]]
) -> tuple[_Expected, list[TtlEvent]]:
    """What one replica must hold after `ops` (each with its reply there, None where the
    write was dropped), and the expiry-deciding events among them."""
    out = _Expected()
    events: list[TtlEvent] = []
    deleted = False  # absent because of a DEL, which every replica applied
    missing = False  # absent here only (a fault): a write re-creates it without the TTL
    # the others have, and repair may rightly copy theirs in: the expiry is unknown then
    for op, reply in ops:
        if reply is None:
            if op.kind == WRITE and deleted:  # the others re-created it; not here
                deleted, missing = False, True
            continue
        if isinstance(reply, str):
            continue  # refused (error reply): changed nothing
        if op.kind == DELETE:
            out.last_delete, out.written, deleted, missing = op.version, {}, True, False
            events.append((op.version, None))
            out.ttl_event = op.version
        elif op.kind == EXPIRE:
            if reply == 1:
                events.append((op.version, op.version))
                out.ttl_event = op.version
            elif not deleted:
                missing = True
        else:
            _, elements = write_command(b"", kind, op.version, op.slot)
            for element in elements:
                out.written[element] = op.version
            if kind == "string" or deleted:  # SET clears a TTL; so does re-creating
                events.append((op.version, None))
                out.ttl_event = op.version
            elif missing:
                events.append((op.version, None))  # what this replica rightly holds now
                out.ttl_event = None
            deleted = missing = False
    return out, events


def judge_replica(
    key: bytes,
    kind: str,
    replica: str,
    expected: _Expected,
    allowed_expiry: set[int | None] | None,
    held: Held,
    verdict: Verdict,
) -> set[str]:
    """The anomaly categories `held` shows (examples go to `verdict`).

    Versions newer than this replica's own writes are fine: a write dropped here
    and copied in by repair. Older ones are not.
    """
    found: dict[str, str] = {}
    for element, version in expected.written.items():
        got = held.elements.get(element)
        if got is None:
            found.setdefault("lost", f"{element!r} v{version} missing, held {held.to_dict()}")
        elif got < version:
            found.setdefault("clobbered", f"{element!r} v{got} where v{version} was written")
    if expected.last_delete is not None and held.exists:
        older = sorted(e for e, v in held.elements.items() if v < expected.last_delete)
        if older or held.type != kind:
            found["resurrected"] = f"held {held.to_dict()} after DEL v{expected.last_delete}"
    if held.exists and allowed_expiry is not None and held.expiry not in allowed_expiry:
        category = "lost" if held.expiry is None else "clobbered"
        found.setdefault(
            category, f"expiry v{held.expiry}, allowed {sorted(allowed_expiry, key=str)}"
        )
    for category, text in found.items():
        verdict.example(category, key, f"on {replica}: {text}")
    return set(found)


def check_history(
    keyspace: Keyspace,
    keys: Sequence[bytes],
    replicas: Sequence[str],
    history: Sequence[Op],
    final: Sequence[Mapping[bytes, Held]],
    outcomes: Mapping[bytes, str],
    *,
    bound_ms: float,
    repair_touched: Mapping[bytes, Sequence[int]],
) -> Verdict:
    """Count anomalies per key: `final[r][key]` is what replica r holds at the end;
    `outcomes` the run's recorded status per key it reported; `repair_touched[key]` the
    instants (epoch ns) the servers ran a command of the repair's naming the key.

    Repair's safety rests on writes reaching every replica within `repair_settle`
    (`bound_ms`). Anomalies on a key where an operation whose fan-out took longer was
    still under way at one of those instants are counted apart, as `outside_bound`: the
    assumption failed there, not the repair. A slow operation the repair never met
    (finished before its first read of the key, or begun after its last command there)
    exempts nothing.
    """
    verdict = Verdict()
    by_key: dict[int, list[Op]] = {}
    for op in history:
        by_key.setdefault(op.key, []).append(op)
    for key in keys:
        index = keyspace.index(key)
        ops = by_key.get(index, [])
        found: set[str] = set()
        if ops:
            kind = keyspace.type(index)
            per_replica = [
                expected_on(kind, [(op, dict(op.applied).get(r)) for op in ops])
                for r in range(len(replicas))
            ]
            events = [e for _, replica_events in per_replica for e in replica_events]
            for r, name in enumerate(replicas):
                expected = per_replica[r][0]
                allowed = (
                    None
                    if expected.ttl_event is None
                    else {x for v, x in events if v >= expected.ttl_event}
                )
                held = final[r].get(key, ABSENT)
                found |= judge_replica(key, kind, name, expected, allowed, held, verdict)
        states = [final[r].get(key, ABSENT) for r in range(len(replicas))]
        if any(s != states[0] for s in states[1:]):
            if outcomes.get(key) in REPORTED_LEFT:
                verdict.left_reported += 1
            else:
                found.add("falsely_fixed")
                summary = ", ".join(
                    f"{n}={s.to_dict()}" for n, s in zip(replicas, states, strict=True)
                )
                verdict.example(
                    "falsely_fixed",
                    key,
                    f"replicas differ, run said {outcomes.get(key)!r}: {summary}",
                )
        met = _slow_ops_met(ops, repair_touched.get(key, ()), bound_ms)
        verdict.slow_during_repair += len(met)
        if found and met:
            verdict.outside_bound += 1
            slowest = max(op.spread_ms for op in met)
            verdict.example(
                "outside_bound",
                key,
                f"{sorted(found)}; v{met[0].version} took {slowest:g} ms (bound {bound_ms:g} ms) "
                "while the repair read or wrote the key",
            )
            continue
        for category in found:  # a key counts once, however many replicas show it
            verdict.counts[category] += 1
    return verdict


_MONITOR_STEP_NS = 1000  # MONITOR stamps commands to the microsecond


def _slow_ops_met(ops: Sequence[Op], touched: Sequence[int], bound_ms: float) -> list[Op]:
    """The operations slower than `bound_ms` that were under way (first send to last
    reply) at one of the instants in `touched`."""
    return [
        op
        for op in ops
        if op.spread_ms > bound_ms
        and any(op.started_ns - _MONITOR_STEP_NS <= t <= op.ended_ns for t in touched)
    ]
