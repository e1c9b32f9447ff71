"""Comparing N members' Tictac trees from the root down, wherever each tree lives.

A member's tree is either built by a scan in a process of this machine
(`scan_process.WorkerTree`) or kept by its region's agent (`AgentTree`,
reached over HTTP). The walk asks every tree
for the nodes below the ones that still differ, a few levels at a time
(`STRIDE` levels per step: a depth-16 tree takes two steps, root → level 12 →
leaves), so a check costs two round trips to each agent for the trees and
moves 8 bytes per node asked, only under differing nodes; then the keys of
the differing leaves (hash, entry hash, name), from which the candidate keys
are those whose entries are not the same everywhere.
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
STRIDE = 12


class MemberTree(Protocol):
    name: str

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
    """Leaves where the trees do not all agree, asking only below differing nodes."""
    level, nodes = 0, np.zeros(1, np.int64)
    first = True
    while level < depth:
        down = min(STRIDE, depth - level)
        values = await asyncio.gather(
            *(t.descendants(level, nodes, down, first=first) for t in trees)
        )
        first = False
        stacked = np.stack(values)
        differ = np.any(stacked != stacked[0], axis=0)
        width = 1 << down
        children = (nodes[:, None] * width + np.arange(width, dtype=np.int64)[None, :]).ravel()
        nodes, level = children[differ], level + down
        if not len(nodes):
            break
    return nodes
