"""Per replica, what differs and what a run did or would do about it: what an operator acts on.

A divergent key is judged against a reference: the primary's state in a
replication group, else the state a majority of members hold (when there is
one). Against it, each member that differs is `missing` the key, holds an
`extra` one, or holds a `different` value, type or expiry. A repair's
decision plans per member a `copy` or a `delete` (in a replication group
made through the primary, but planned for the replica it fixes); a member
that differs and is not planned for a write that landed is `leave`: still
divergent after the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from replag.repair.decisions import report as rp
from replag.repair.decisions.policy import Decision
from replag.repair.keyspace.observe import ABSENT, KeyState

FINDINGS = rp.KEY_FINDINGS
ACTIONS = ("copy", "delete", "leave")
# Statuses whose planned writes landed (or, in a dry run, would be made). A key left for a
# resync is not one: the primary's write did not reach the replica, which stays divergent.
_DONE = (rp.REPAIRED, rp.DRY_RUN)


def reference(states: Sequence[KeyState], primary: int | None) -> KeyState | None:
    """What the members are judged against: the primary's state, else a strict
    majority's (absent on most, or one value on most), else None."""
    if primary is not None:
        return states[primary]
    n = len(states)
    absent = sum(not s.exists for s in states)
    if 2 * absent > n:
        return ABSENT
    groups: list[list[KeyState]] = []
    for state in states:
        if not state.exists:
            continue
        for group in groups:
            if group[0].same_value(state):
                group.append(state)
                break
        else:
            groups.append([state])
    best = max(groups, key=len, default=[])
    return best[0] if 2 * len(best) > n else None


def findings(
    names: Sequence[str],
    states: Sequence[KeyState],
    primary: int | None,
    tolerance_ms: int,
) -> dict[str, str]:
    """Member name → missing, extra or different, for each member that differs."""
    ref = reference(states, primary)
    out: dict[str, str] = {}
    for i, (name, state) in enumerate(zip(names, states, strict=True)):
        if i == primary:
            continue
        if ref is None:
            out[name] = "different" if state.exists else "missing"
        elif ref.exists and not state.exists:
            out[name] = "missing"
        elif state.exists and not ref.exists:
            out[name] = "extra"
        elif state.exists and not state.same_as(ref, tolerance_ms):
            out[name] = "different"
    return out


def plan(names: Sequence[str], decision: Decision) -> dict[str, str]:
    """Member name → copy or delete: who a copy-or-delete decision changes."""
    if decision.action not in ("copy", "delete"):
        return {}
    return {names[t]: str(decision.action) for t in decision.targets}


def per_replica(
    names: Sequence[str], records: Iterable[tuple[str, dict[str, Any]]]
) -> dict[str, dict[str, int]]:
    """Counts per member over (status, detail) records: missing, extra, different,
    and copy, delete, leave (a key the replicas agree on by now is not left)."""
    counts = {name: dict.fromkeys(FINDINGS + ACTIONS, 0) for name in names}
    for status, detail in records:
        found: dict[str, str] = detail.get("findings", {})
        planned: dict[str, str] = detail.get("plan", {}) if status in _DONE else {}
        for name, finding in found.items():
            if name in counts:
                counts[name][finding] += 1
        if status == rp.AGREED:
            # Clients wrote it meanwhile and the replicas agree now (a resumed run's keys,
            # say): found, but not left: nothing differs any more.
            continue
        for name in set(found) | set(planned):
            if name not in counts:
                continue
            action = planned.get(name)
            counts[name][action if action is not None else "leave"] += 1
    return counts
