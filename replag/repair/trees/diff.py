"""From N replicas' scans to divergent keys: trees first, then keys, then a classification.

The trees name the differing leaves; only keys in those leaves are compared by
entry hash; only keys whose entries differ are read again on every replica
(`KeyState`) and classified. That last read is what keeps races out of the
report: a key deleted, expired or rewritten everywhere during the scan agrees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from replag.repair.keyspace.field_ttls import differing_fields
from replag.repair.keyspace.observe import KeyState, key_to_json
from replag.repair.trees.index import ScanIndex
from replag.repair.trees.tictac import TictacTree, differing_leaves, leaf_of

Kind = Literal["missing", "type", "value", "ttl"]
KINDS: tuple[Kind, ...] = ("missing", "type", "value", "ttl")


def candidate_keys(indexes: Sequence[ScanIndex], trees: Sequence[TictacTree]) -> list[bytes]:
    """Keys in differing leaves whose entry hash is not the same on every replica."""
    leaves = differing_leaves(trees)
    if len(leaves) == 0:
        return []
    depth = trees[0].depth
    return differing_keys([in_leaves(index, leaves, depth) for index in indexes])


def in_leaves(index: ScanIndex, leaves: npt.NDArray[np.int64], depth: int) -> ScanIndex:
    """The part of `index` whose keys fall in `leaves`."""
    picked = np.flatnonzero(np.isin(leaf_of(index.key_hashes, depth), leaves))
    keys = [index.key(int(i)) for i in picked]
    return ScanIndex(
        index.key_hashes[picked],
        index.entries[picked],
        np.fromiter(map(len, keys), np.uint32, count=len(keys)),
        b"".join(keys),
    )


def differing_keys(indexes: Sequence[ScanIndex]) -> list[bytes]:
    """Keys (each index one replica's keys of the same leaves) whose entry hash is missing
    or different somewhere, sorted."""
    indexes = list(indexes)
    if not indexes or not sum(len(index) for index in indexes):
        return []
    hashes = np.concatenate([index.key_hashes for index in indexes])
    owner = np.concatenate([np.full(len(index), i, np.int64) for i, index in enumerate(indexes)])
    row = np.concatenate([np.arange(len(index), dtype=np.int64) for index in indexes])
    unique, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    # Per distinct key: on how many replicas it is, and whether their entries all agree.
    entries = np.concatenate([index.entries for index in indexes])
    present = np.bincount(inverse, minlength=len(unique))
    smallest = np.full(len(unique), np.iinfo(np.uint64).max, np.uint64)
    largest = np.zeros(len(unique), np.uint64)
    np.minimum.at(smallest, inverse, entries)
    np.maximum.at(largest, inverse, entries)
    differ = np.flatnonzero((present < len(indexes)) | (smallest != largest))
    return sorted(indexes[int(owner[first[d]])].key(int(row[first[d]])) for d in differ)


def brute_force_candidates(indexes: Sequence[ScanIndex]) -> list[bytes]:
    """The same answer without trees (for tests): every key whose entries differ."""
    maps = [{index.key(i): int(index.entries[i]) for i in range(len(index))} for index in indexes]
    keys = set().union(*maps)
    return sorted(k for k in keys if len({m.get(k) for m in maps}) > 1)


def classify(
    states: Sequence[KeyState], *, tolerance_ms: int, now_ms: int, ttls: bool = True
) -> Kind | None:
    """The most severe difference among `states`, None when they agree (`ttls=False`:
    expiries are not compared, only presence, type and value).

    A key present only where it is about to expire (within the tolerance) is
    an expiry in progress, not a missing key.
    """
    present = [s for s in states if s.exists]
    if not present:
        return None
    if len(present) < len(states):
        dying = all(
            (r := s.remaining_ms(now_ms)) is not None and r <= tolerance_ms for s in present
        )
        return None if dying else "missing"
    if len({s.type for s in present}) > 1:
        return "type"
    if len({s.digest for s in present}) > 1:
        return "value"
    first = present[0]
    if ttls and any(not first.same_expiry(s, tolerance_ms) for s in present[1:]):
        return "ttl"
    return None


@dataclass(frozen=True)
class Divergence:
    """One divergent key: what each replica (by name) held when it was verified."""

    key: bytes
    kind: Kind
    states: dict[str, KeyState]
    # The expiry tolerance it was judged with: which hash fields' TTLs differ (`to_dict`).
    tolerance_ms: int = field(default=0, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = {
            **key_to_json(self.key),
            "kind": self.kind,
            "replicas": {name: state.to_dict() for name, state in self.states.items()},
        }
        expiries = [s.field_expiries for s in self.states.values()]
        if self.kind == "ttl" and any(e is not None for e in expiries):
            names, count = differing_fields(expiries, self.tolerance_ms)
            if count:
                out["fields"] = {"differing": count, "named": names}
        return out
