"""Comparing N members' Tictac trees from the root down, wherever each tree lives.

A member's tree is either built by a scan in a process of this machine
(`scan_process.WorkerTree`) or kept by its region's agent (`AgentTree`,
reached over HTTP), where every question is a WAN round trip. The walk asks
every tree for the nodes of a level below the root (`depth - 2`: 16,384
nodes, 128 kB, for a depth-16 tree), keeps the nodes where the trees differ,
and then either fetches the keys of the subtrees under them (hash, entry
hash, name: ~40 bytes a key) or, when that would move more than
`CONTENTS_BUDGET` bytes, asks for node values `STRIDE` levels further down
first. A round trip across a WAN costs more than a few megabytes of keys:
with 1M keys and 1,000 divergent ones a check walks in one step and fetches
~60,000 keys' hashes per member, then reads only the candidate keys (those
whose entries are not the same everywhere).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from replag.errors import AgentError
from replag.repair.remote import BUCKET_HEADER, DEPTH_HEADER, KEYS_HEADER, AgentClient
from replag.repair.scan import ScanIndex

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
STRIDE = 2
CONTENTS_BUDGET = 4 << 20  # bytes per member: below this, fetch keys rather than descend
KEY_BYTES = 40  # a key in leaf contents: hash, entry hash, length, a name of ~20 bytes


class MemberTree(Protocol):
    name: str
    keys: int  # keys in the tree (known after the first question, for an agent's)

    async def descendants(self, level: int, nodes: I64, down: int, *, first: bool) -> U64:
        """For each node of `level`, its 2**down descendants `down` levels below."""
        ...

    async def leaf_keys(self, leaves: I64) -> ScanIndex: ...


def nodes_below(levels: list[U64], level: int, nodes: I64, down: int) -> U64:
    """For each node of `level`, its 2**down descendants `down` levels below (a tree's
    `levels()`)."""
    width = 1 << down
    index = (nodes[:, None] * width + np.arange(width, dtype=np.int64)[None, :]).ravel()
    values: U64 = levels[level + down][index]
    return values


class AgentTree:
    """A member whose tree its region's agent keeps; every call is one HTTP request."""

    def __init__(
        self,
        name: str,
        client: AgentClient,
        *,
        depth: int,
        ttl_bucket_ms: int,
        wait_s: float,
    ) -> None:
        self.name = name
        self.client = client
        self.depth = depth
        self.ttl_bucket_ms = ttl_bucket_ms
        self.wait_s = wait_s
        self.keys = 0

    async def descendants(self, level: int, nodes: I64, down: int, *, first: bool) -> U64:
        # The first request makes the agent catch up with every write its replica applied
        # before it (waiting up to wait_s for a tree being built); later ones read that tree.
        values, headers = await self.client.descendants(
            self.name, level, nodes.tolist(), down, fresh=first, wait_s=self.wait_s
        )
        if first:
            self._check_shape(headers)
        return values

    def _check_shape(self, headers: Mapping[str, str]) -> None:
        depth = int(headers.get(DEPTH_HEADER, -1))
        bucket = int(headers.get(BUCKET_HEADER, -1))
        if (depth, bucket) != (self.depth, self.ttl_bucket_ms):
            raise AgentError(
                f"tree of {self.name} has depth {depth} and TTL buckets of {bucket} ms; this "
                f"check uses {self.depth} and {self.ttl_bucket_ms} ms: give the agent the same "
                "settings (ttl_tolerance)",
                where=self.client.url,
            )
        self.keys = int(headers.get(KEYS_HEADER, 0))

    async def leaf_keys(self, leaves: I64) -> ScanIndex:
        return await self.client.leaf_keys(self.name, leaves.tolist())


async def differing_leaves(trees: Sequence[MemberTree], depth: int) -> I64:
    """The leaves whose keys to compare: all the leaves under the nodes where the trees
    differ, found by asking only below differing nodes."""
    level, nodes = 0, np.zeros(1, np.int64)
    first = True
    while level < depth:
        down = max(depth - 2, 1) if first else min(STRIDE, depth - level)
        values = await asyncio.gather(
            *(t.descendants(level, nodes, down, first=first) for t in trees)
        )
        first = False
        stacked = np.stack(values)
        differ = np.any(stacked != stacked[0], axis=0)
        width = 1 << down
        children = (nodes[:, None] * width + np.arange(width, dtype=np.int64)[None, :]).ravel()
        nodes, level = children[differ], level + down
        keys_below = len(nodes) * max(t.keys for t in trees) / (1 << level)
        if not len(nodes) or keys_below * KEY_BYTES <= CONTENTS_BUDGET:
            break
    span = depth - level
    return (nodes[:, None] * (1 << span) + np.arange(1 << span, dtype=np.int64)[None, :]).ravel()
