"""Resolution policies: given what every replica holds, which value wins and who is rewritten.

quorum            the value held by a strict majority wins; a key some replicas
                  lack is copied from the replicas holding it (a dropped write is
                  far more common than a dropped delete) unless --allow-deletes and
                  a strict majority lacks it; any tie is a conflict, never a guess.
source:NAME       that replica (by name, or the only member in that region) wins.
newest:FIELD      the value with the greatest timestamp FIELD (JSON field of a
                  string value, or hash field) wins; equal newest values that
                  differ are a conflict; never deletes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from replag.errors import NotFound, UsageError
from replag.repair.observe import KeyState
from replag.topology import Endpoint

Action = Literal["copy", "delete", "conflict", "keep"]


@dataclass(frozen=True)
class Decision:
    """`copy`: write the winner's value/TTL to `targets`; `delete`: DEL on `targets`;
    `conflict`: nothing is written, `reason` says why; `keep`: nothing to do."""

    action: Action
    winner: int | None = None
    targets: tuple[int, ...] = ()
    reason: str = ""


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


Policy = Quorum | Source | Newest


def parse_policy(text: str, members: Sequence[Endpoint]) -> Policy:
    """`quorum`, `source:REPLICA_OR_REGION` or `newest:FIELD`; UsageError otherwise."""
    kind, _, arg = text.partition(":")
    if kind == "quorum" and not arg:
        return Quorum()
    if kind == "newest" and arg:
        return Newest(arg)
    if kind == "source" and arg:
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
        f"--policy: expected quorum, source:REPLICA_OR_REGION or newest:FIELD, got {text!r}"
    )
