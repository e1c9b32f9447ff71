"""Resolution policies: given what every replica holds, which value wins and who is rewritten.

primary           (replication groups' default) the primary's state wins both
                  ways: its value where it has the key, absent where it lacks it.
majority          (Dynomite groups' default) the racks' majority wins both ways:
                  present on a strict majority → copied, present only on a
                  minority → deleted; a tie, or a probe record showing two or
                  more racks cut off in `repair_outage_window`, is a conflict.
quorum            (independent peers' default) the value held by a strict
                  majority wins; a key some replicas lack is copied from the
                  replicas holding it (a dropped write is far more common than a
                  dropped delete) unless --allow-deletes and a strict majority
                  lacks it; any tie is a conflict, never a guess.
source:NAME       that replica (by name, or the only member in that region) wins.
newest:FIELD      the value with the greatest timestamp FIELD (JSON field of a
                  string value, or hash field) wins; equal newest values that
                  differ are a conflict; never deletes.

A policy decides what the members should hold; the group's kind decides where
it is written: in a replication group only on the primary (`through_primary`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from replag.errors import NotFound, UsageError
from replag.repair.keyspace.observe import KeyState
from replag.topology import Endpoint

Action = Literal["copy", "delete", "conflict", "keep", "resync"]
# Each kind's policy when --policy is not given.
DEFAULT_POLICY = {"replication": "primary", "dynomite": "majority", "peers": "quorum"}


@dataclass(frozen=True)
class Decision:
    """`copy`: write the winner's value/TTL to `targets`; `delete`: DEL on `targets`;
    `conflict`: nothing is written, `reason` says why; `keep`: nothing to do; `resync`:
    only a resync can fix the members that differ (nothing is written).

    With `via` (a replication group's primary), nothing is written to `targets`: the
    write is made on `via` and replication carries it to them; `left` are members the
    decision wanted changed that do not follow `via` (a resync fixes them)."""

    action: Action
    winner: int | None = None
    targets: tuple[int, ...] = ()
    reason: str = ""
    via: int | None = None
    left: tuple[int, ...] = ()


def _targets(states: Sequence[KeyState], winner: int, tolerance_ms: int) -> tuple[int, ...]:
    return tuple(
        i
        for i, s in enumerate(states)
        if i != winner and not s.same_as(states[winner], tolerance_ms)
    )


def _strict_majority(groups: list[list[int]], total: int) -> list[int] | None:
    best = max(groups, key=len, default=None)
    return best if best is not None and 2 * len(best) > total else None


def _value_groups(states: Sequence[KeyState], members: Sequence[int]) -> list[list[int]]:
    groups: list[list[int]] = []
    for i in members:
        for group in groups:
            if states[group[0]].same_value(states[i]):
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


def _expiry_winner(states: Sequence[KeyState], members: list[int], tolerance_ms: int) -> int | None:
    """The member whose expiry the most others share (within tolerance); None on a tie."""
    support = {
        i: sum(states[i].same_expiry(states[j], tolerance_ms) for j in members) for i in members
    }
    top = max(support.values())
    leaders = [i for i in members if support[i] == top]
    if len({states[i].expiry_ms is None for i in leaders}) > 1 or (
        len(leaders) > 1
        and not all(states[leaders[0]].same_expiry(states[i], tolerance_ms) for i in leaders)
    ):
        return None
    return leaders[0]


@dataclass(frozen=True)
class Quorum:
    name: str = "quorum"

    def decide(
        self, states: Sequence[KeyState], *, allow_deletes: bool, tolerance_ms: int
    ) -> Decision:
        n = len(states)
        present = [i for i, s in enumerate(states) if s.exists]
        absent = [i for i, s in enumerate(states) if not s.exists]
        if not present:
            return Decision("keep")
        if absent and allow_deletes and 2 * len(absent) > n:
            return Decision(
                "delete",
                targets=tuple(present),
                reason=f"{len(absent)} of {n} replicas lack the key",
            )
        pool = present if absent else list(range(n))
        majority = _strict_majority(_value_groups(states, pool), len(pool))
        if majority is None:
            where = "replicas holding the key" if absent else "replicas"
            return Decision("conflict", reason=f"no strict majority among the {len(pool)} {where}")
        winner = _expiry_winner(states, majority, tolerance_ms)
        if winner is None:
            return Decision("conflict", reason="the majority value has tied expiry times")
        return Decision(
            "copy",
            winner,
            _targets(states, winner, tolerance_ms),
            f"held by {len(majority)} of {len(pool)}",
        )


@dataclass(frozen=True)
class Source:
    index: int
    label: str

    @property
    def name(self) -> str:
        return f"source:{self.label}"

    def decide(
        self, states: Sequence[KeyState], *, allow_deletes: bool, tolerance_ms: int
    ) -> Decision:
        source = states[self.index]
        if not source.exists:
            present = tuple(i for i, s in enumerate(states) if s.exists)
            if allow_deletes:
                return Decision("delete", targets=present, reason=f"{self.label} lacks the key")
            return Decision("keep", reason=f"{self.label} lacks the key; deletes not allowed")
        return Decision(
            "copy",
            self.index,
            _targets(states, self.index, tolerance_ms),
            f"{self.label} is the source",
        )


@dataclass(frozen=True)
class Primary:
    """A replication group's primary is the truth, both ways (deletes need no flag: a key
    only on replicas is a replica's stray write, or a delete it missed)."""

    index: int
    label: str
    name: str = "primary"

    def decide(
        self, states: Sequence[KeyState], *, allow_deletes: bool, tolerance_ms: int
    ) -> Decision:
        primary = states[self.index]
        if not primary.exists:
            present = tuple(i for i, s in enumerate(states) if s.exists)
            return Decision("delete", targets=present, reason=f"not on the primary {self.label}")
        return Decision(
            "copy",
            self.index,
            _targets(states, self.index, tolerance_ms),
            f"the primary {self.label}'s value",
        )


@dataclass(frozen=True)
class Majority:
    """Dynomite racks: a rack cut off misses SETs and DELs alike, so the majority's state
    wins both ways while at most one rack was cut off (`cut_off`: the members the probes
    saw miss writes in `window`)."""

    cut_off: tuple[str, ...] = ()
    window: str = ""
    name: str = "majority"

    def decide(
        self, states: Sequence[KeyState], *, allow_deletes: bool, tolerance_ms: int
    ) -> Decision:
        n = len(states)
        if len(self.cut_off) > 1:
            return Decision(
                "conflict",
                reason=f"{len(self.cut_off)} racks missed probe writes in the last "
                f"{self.window} ({', '.join(self.cut_off)}): a majority may have missed the "
                "same write; decide with --policy source:RACK or newest:FIELD",
            )
        present = [i for i, s in enumerate(states) if s.exists]
        absent = [i for i, s in enumerate(states) if not s.exists]
        if not present:
            return Decision("keep")
        if 2 * len(absent) > n:
            return Decision(
                "delete",
                targets=tuple(present),
                reason=f"absent on {len(absent)} of {n} racks",
            )
        if absent and 2 * len(present) == n:
            return Decision(
                "conflict", reason=f"racks tie: {len(present)} hold the key, {len(absent)} lack it"
            )
        decided = Quorum().decide(states, allow_deletes=False, tolerance_ms=tolerance_ms)
        if decided.action == "copy" and absent:
            reason = f"present on {len(present)} of {n} racks, {decided.reason}"
            return Decision("copy", decided.winner, decided.targets, reason)
        return decided


def through_primary(
    decision: Decision,
    states: Sequence[KeyState],
    *,
    primary: int,
    unfollowing: dict[int, str],
    names: Sequence[str],
) -> Decision:
    """`decision` as a replication group carries it out: written on the primary only.

    A copy re-asserts the winner's state on the primary (RESTORE of its own DUMP when it
    already holds it, since an unchanged key would replicate nothing); a delete is a DEL
    there, or, where the primary lacks the key, a SET and DEL in one transaction: a DEL
    of a missing key is not replicated. Members that do not follow the primary are `left`
    for a resync; when they are all that differ, nothing is written."""
    if decision.action not in ("copy", "delete"):
        return decision
    targets = tuple(t for t in decision.targets if t == primary or t not in unfollowing)
    left = tuple(t for t in decision.targets if t != primary and t in unfollowing)
    if not targets:
        why = "; ".join(f"{names[t]}: {unfollowing[t]}" for t in left)
        return Decision("resync", reason=f"only a resync fixes it ({why})", left=left)
    reason = decision.reason
    if left:
        reason += "; left for a resync: " + ", ".join(names[t] for t in left)
    return Decision(decision.action, decision.winner, targets, reason, via=primary, left=left)


def timestamp_of(state: KeyState, field: str) -> float | None:
    """FIELD of a JSON object string value or of a hash, as a number; None if absent."""
    raw: object = None
    if state.type == "string" and isinstance(state.data, bytes):
        try:
            document = json.loads(state.data)
        except (ValueError, UnicodeDecodeError):
            return None
        raw = document.get(field) if isinstance(document, dict) else None
    elif state.type == "hash" and state.fields is not None:
        raw = state.fields.get(field.encode())
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        return None
    try:
        number = float(raw)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class Newest:
    field: str

    @property
    def name(self) -> str:
        return f"newest:{self.field}"

    def decide(
        self, states: Sequence[KeyState], *, allow_deletes: bool, tolerance_ms: int
    ) -> Decision:
        stamped = [
            (ts, i)
            for i, s in enumerate(states)
            if s.exists and (ts := timestamp_of(s, self.field)) is not None
        ]
        if not stamped:
            return Decision("conflict", reason=f"no replica's value has a numeric {self.field!r}")
        newest = max(ts for ts, _ in stamped)
        leaders = [i for ts, i in stamped if ts == newest]
        if len(_value_groups(states, leaders)) > 1:
            return Decision("conflict", reason=f"different values share {self.field}={newest:g}")
        winner = _expiry_winner(states, leaders, tolerance_ms)
        if winner is None:
            return Decision("conflict", reason="the newest value has tied expiry times")
        return Decision(
            "copy",
            winner,
            _targets(states, winner, tolerance_ms),
            f"{self.field}={newest:g} is the newest",
        )


Policy = Quorum | Source | Newest | Primary | Majority


def parse_policy(
    text: str | None,
    members: Sequence[Endpoint],
    *,
    kind: str = "peers",
    primary: int = 0,
    cut_off: tuple[str, ...] = (),
    window: str = "",
) -> Policy:
    """`primary`, `majority`, `quorum`, `source:REPLICA_OR_REGION` or `newest:FIELD`
    (None: the default of the group's `kind`); UsageError otherwise. `primary` is the
    primary member's index, `cut_off` the members the probes saw miss writes."""
    if text is None:
        text = DEFAULT_POLICY.get(kind, "quorum")
    kind_name, _, arg = text.partition(":")
    if kind_name == "quorum" and not arg:
        return Quorum()
    if kind_name == "primary" and not arg:
        if kind not in ("replication", "auto"):
            raise UsageError(f"--policy primary: the group is not a replication group ({kind})")
        return Primary(primary, members[primary].name)
    if kind_name == "majority" and not arg:
        return Majority(cut_off, window)
    if kind_name == "newest" and arg:
        return Newest(arg)
    if kind_name == "source" and arg:
        by_name = [i for i, m in enumerate(members) if m.name == arg]
        by_region = [i for i, m in enumerate(members) if m.region == arg or m.rack == arg]
        found = by_name or by_region
        if len(found) == 1:
            return Source(found[0], arg)
        names = ", ".join(m.name for m in members)
        if not found:
            raise NotFound(f"--policy source:{arg}: no such replica or region (members: {names})")
        raise UsageError(
            f"--policy source:{arg}: several members are in {arg}; name one of "
            f"{', '.join(members[i].name for i in found)}"
        )
    raise UsageError(
        "--policy: expected primary, majority, quorum, source:REPLICA_OR_REGION or "
        f"newest:FIELD, got {text!r}"
    )
