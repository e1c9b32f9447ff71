"""Keys every member holds as a value replag cannot read whole (`KeyState.opaque`), by type.

Such a key's presence, type and expiry are compared; its value is not, so a run that
met one cannot call the group clean: the report lists these keys by type, with
counts and the first few names (`EXAMPLES`), and the run is NOT CLEAN (exit 1).
Memory stays bounded whatever their number: a count and a few names per type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from replag.repair.keyspace.observe import KeyState, key_text

EXAMPLES = 10


@dataclass
class _Tally:
    keys: int = 0
    why: str = ""
    examples: list[bytes] = field(default_factory=list)


def uncompared(states: Sequence[KeyState]) -> KeyState | None:
    """The first opaque state when every member holds the key as an opaque value of one
    type (their values cannot be told apart), else None."""
    if not states or not all(s.exists and s.opaque is not None for s in states):
        return None
    return states[0] if len({s.type for s in states}) == 1 else None


class NotCompared:
    """Per type: how many keys were not compared, why, and the first `EXAMPLES` names."""

    def __init__(self) -> None:
        self._types: dict[str, _Tally] = {}

    def __bool__(self) -> bool:
        return bool(self._types)

    @property
    def keys(self) -> int:
        return sum(t.keys for t in self._types.values())

    def add(self, key: bytes, state: KeyState) -> None:
        tally = self._types.setdefault(str(state.type), _Tally(why=state.opaque or ""))
        tally.keys += 1
        if len(tally.examples) < EXAMPLES:
            tally.examples.append(key)

    def to_list(self) -> list[dict[str, Any]]:
        return [
            {
                "type": name,
                "keys": t.keys,
                "why": t.why,
                "examples": [key_text(k) for k in t.examples],
            }
            for name, t in sorted(self._types.items())
        ]
