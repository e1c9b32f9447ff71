"""Comparing N members' Tictac trees from the root down, wherever each tree lives.

A member's tree is either built by a scan in a process of this machine
(`scan_process.WorkerTree`) or kept by its region's agent (`AgentTree`,
reached over HTTP), where every question is a WAN round trip.

What a check moves is the node values it asks for (8 bytes a node) plus the
keys (hash, entry hash, name: ~40 bytes a key) under the nodes that differ.
Asking a level of 2**L nodes costs 8 * 2**L bytes and leaves K / 2**L keys
under each differing node, so for D differences the cheapest level has
2**L ≈ sqrt(5 D K) nodes. D is not known before the walk; the first question
assumes about 0.1% of the keys differ, i.e. nodes covering about
`KEYS_PER_NODE` keys: each tree answers it at the level its own key count
calls for (`first_down`: the 65,536 leaves of a depth-16 tree from 1M keys
up, level 11 for 20,000 keys), and the answers are folded (XOR of siblings)
to the shallowest level any member gave. The walk then asks only below the
nodes that differ, `STRIDE` levels at a time, until the keys under them fit
in `CONTENTS_BUDGET`, fetches the keys of those leaves only, a batch of
leaves at a time within the check's budget (`keys_in_batches`), and reads only
the candidate keys (those whose entries are not the same everywhere). With
1M keys and 1,000 divergent ones a check asks each agent three questions:
the leaves (512 kB), the keys of the ~1,000 differing leaves (~15,000 keys,
600 kB), the candidates' states.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from replag.errors import AgentError
from replag.repair.keyspace.together import all_of
from replag.repair.trees.index import ScanIndex
from replag.repair.trees.remote import BUCKET_HEADER, DEPTH_HEADER, KEYS_HEADER, AgentClient

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
KEYS_PER_NODE = 16  # the first question's level: nodes covering about this many keys
FIRST_MAX_DOWN = 16  # ... and at most 65,536 nodes (512 kB)
STRIDE = 2
CONTENTS_BUDGET = 4 << 20  # bytes per member: below this, fetch keys rather than descend
KEY_BYTES = 40  # a key in leaf contents: hash, entry hash, length, a name of ~20 bytes


class MemberTree(Protocol):
    name: str
    keys: int  # keys in the tree (known after the first question, for an agent's)

    async def first_nodes(self, depth: int) -> tuple[int, U64]:
        """The walk's first question: (L, the root's descendants at level L), L as deep
        as the tree's key count calls for (`first_down`)."""
        ...

    async def descendants(self, level: int, nodes: I64, down: int) -> U64:
        """For each node of `level`, its 2**down descendants `down` levels below."""
        ...

    async def leaf_keys(self, leaves: I64) -> ScanIndex: ...

    async def select_leaves(self, batches: Sequence[I64]) -> None:
        """The leaves whose keys `batch_keys` will be asked for, batch by batch."""
        ...

    async def batch_keys(self, batch: int) -> ScanIndex:
        """The keys of `select_leaves`'s batch `batch`."""
        ...


def first_down(keys: int, depth: int) -> int:
    """The level of the walk's first question for a tree of `keys` keys: nodes covering
    about `KEYS_PER_NODE` keys, at least level 1, at most `FIRST_MAX_DOWN` or the leaves."""
    want = math.ceil(math.log2(keys / KEYS_PER_NODE)) if keys > 2 * KEYS_PER_NODE else 1
    return max(1, min(want, depth, FIRST_MAX_DOWN))


def fold(values: U64, up: int) -> U64:
    """Node values of a level `up` levels above those given (an inner node is the XOR of
    its two children)."""
    if up == 0:
        return values
    folded: U64 = np.bitwise_xor.reduce(values.reshape(-1, 1 << up), axis=1)
    return folded


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
        self._batches: list[I64] = []

    async def first_nodes(self, depth: int) -> tuple[int, U64]:
        # The first request makes the agent catch up with every write its replica applied
        # before it (waiting up to wait_s for a tree being built); later ones read that
        # tree. The agent picks the level (`first_down` of its key count).
        down, values, headers = await self.client.first_nodes(self.name, depth, wait_s=self.wait_s)
        self._check_shape(headers)
        return down, values

    async def descendants(self, level: int, nodes: I64, down: int) -> U64:
        values, _ = await self.client.descendants(self.name, level, nodes.tolist(), down)
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

    async def select_leaves(self, batches: Sequence[I64]) -> None:
        self._batches = list(batches)  # the agent answers each batch from its key table

    async def batch_keys(self, batch: int) -> ScanIndex:
        return await self.leaf_keys(self._batches[batch])


async def differing_leaves(trees: Sequence[MemberTree], depth: int) -> I64:
    """The leaves whose keys to compare: the differing leaves, or all the leaves under
    the differing nodes once their keys fit in `CONTENTS_BUDGET`, found by asking only
    below differing nodes."""
    answers = await all_of(t.first_nodes(depth) for t in trees)
    level = min(down for down, _ in answers)
    values = [fold(v, down - level) for down, v in answers]
    nodes = np.arange(1 << level, dtype=np.int64)
    while True:
        stacked = np.stack(values)
        nodes = nodes[np.any(stacked != stacked[0], axis=0)]
        keys_below = len(nodes) * max(t.keys for t in trees) / (1 << level)
        if level == depth or not len(nodes) or keys_below * KEY_BYTES <= CONTENTS_BUDGET:
            break
        down = min(STRIDE, depth - level)
        values = await all_of(t.descendants(level, nodes, down) for t in trees)
        width = 1 << down
        nodes = (nodes[:, None] * width + np.arange(width, dtype=np.int64)[None, :]).ravel()
        level += down
    span = depth - level
    return (nodes[:, None] * (1 << span) + np.arange(1 << span, dtype=np.int64)[None, :]).ravel()


def leaf_batches(leaves: I64, keys_per_leaf: float, members: int, budget_bytes: int) -> list[I64]:
    """`leaves` in batches (sorted, in order) whose keys, on all `members` together, come
    to about `budget_bytes` (`KEY_BYTES` a key), at least one leaf a batch. A differing
    leaf holds a key more than the mean (at least the one that differs)."""
    per_leaf = (keys_per_leaf + 1) * KEY_BYTES * max(1, members)
    size = max(1, int(budget_bytes // per_leaf))
    ordered = np.sort(leaves).astype(np.int64)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


async def keys_in_batches(
    trees: Sequence[MemberTree], leaves: I64, depth: int, budget_bytes: int
) -> AsyncIterator[list[ScanIndex]]:
    """Every member's keys of `leaves`, a batch of leaves at a time (each member's part of
    a batch, in the trees' order): what the check holds at once stays near `budget_bytes`
    whatever the keyspace (a leaf of the 2^16-leaf tree holds ~1,500 keys at 100M)."""
    if not len(leaves):
        return
    keys_per_leaf = max(t.keys for t in trees) / (1 << depth)
    batches = leaf_batches(leaves, keys_per_leaf, len(trees), budget_bytes)
    await all_of(t.select_leaves(batches) for t in trees)
    for i in range(len(batches)):
        yield await all_of(t.batch_keys(i) for t in trees)
