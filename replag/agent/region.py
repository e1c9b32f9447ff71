"""`RegionAgent`: the live trees of one region's replicas, and whatever else the agent runs.

The agent keeps a `LiveTree` for every member of a replica group that lives
in its region, reached at its address inside the region (`local`, else `url`). Other
work an agent does next to the data plugs in as an `AgentPart`: it is started
and stopped with the agent, may add routes to its API (behind the same token)
and metrics to its `/metrics`, and can listen to each replica's keyspace
notifications through the tree's subscription (`LiveTree.listeners`), so one
subscription per replica serves everything.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from fastapi import APIRouter
from prometheus_client.metrics_core import Metric

from replag.agent.auth import AgentAudit
from replag.agent.livetree import LiveTree
from replag.background import cancel_and_wait
from replag.config import Config
from replag.errors import UsageError
from replag.logfields import bind_log_fields
from replag.repair.scan.scanner import ScanOptions
from replag.repair.trees.tictac import DEFAULT_DEPTH
from replag.repair.writes.lanes import ReplicaLane
from replag.settings import Settings
from replag.topology import Endpoint

log = logging.getLogger(__name__)


class AgentPart(Protocol):
    """Something else a region agent serves (e.g. lag observation of probe keys)."""

    name: str
    router: APIRouter | None

    async def start(self, agent: RegionAgent) -> None: ...

    async def stop(self) -> None: ...

    def collect(self) -> Iterable[Metric]: ...


def tree_options(settings: Settings) -> ScanOptions:
    """Scan options matching the coordinator's (`repair.engine`), so entry hashes agree."""
    return ScanOptions(
        count=max(10, settings.scan_count),
        timeout_s=settings.connect_timeout,
        exclude_prefix=settings.prefix.encode(),
        ttl_bucket_ms=max(int(settings.ttl_tolerance * 1000), 1),
        live=True,
    )


def local_members(config: Config, region: str) -> list[Endpoint]:
    """Replica-group members of `region`, each once, in config order."""
    config.topology.region(region)  # UsageError naming the known regions
    seen: dict[str, Endpoint] = {}
    for group in config.topology.groups:
        for member in group.members:
            if member.region == region:
                seen.setdefault(member.name, member)
    return list(seen.values())


class RegionAgent:
    """Owns the live trees (and parts) of one region; `start()`/`stop()` run them."""

    def __init__(
        self,
        config: Config,
        region: str,
        *,
        state_dir: Path | None = None,
        parts: Iterable[AgentPart] = (),
        poll_s: float = 1.0,
    ) -> None:
        self.config = config
        self.settings = config.settings
        self.region = region
        members = local_members(config, region)
        if not members:
            raise UsageError(
                f"region {region!r} has no replica-group members: no trees to keep "
                "(list its replicas in a [[groups]] entry)"
            )
        options = tree_options(self.settings)
        if state_dir is None:
            state_dir = Path(self.settings.agent_state_dir).expanduser() / region
        self.state_dir = state_dir
        self.audit = AgentAudit(state_dir)
        self.trees: dict[str, LiveTree] = {
            m.name: LiveTree(
                m.in_region(),
                options=options,
                depth=DEFAULT_DEPTH,
                state_dir=state_dir,
                poll_s=poll_s,
                manage_notifications=self.settings.allow_config_changes,
                declared_notifications=self.settings.notify_keyspace_events,
            )
            for m in members
        }
        self.parts = list(parts)
        self.chunk = options.count
        # Repair writes (WATCH is per connection): a few connections per replica.
        self.lanes = {
            m.name: ReplicaLane(m.in_region(), self.settings.max_inflight, None, options.timeout_s)
            for m in members
        }
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for name, tree in self.trees.items():
            with bind_log_fields(replica=name):  # the task's lines name its replica
                self._tasks.append(asyncio.create_task(tree.run(), name=f"tree-{name}"))
        for part in self.parts:
            await part.start(self)
        log.info(
            "agent of %s: keeping trees of %s (state in %s)",
            self.region,
            ", ".join(self.trees),
            self.state_dir,
        )

    async def stop(self) -> None:
        for part in self.parts:
            try:
                await part.stop()
            except Exception:  # one failing part must not keep the trees from saving
                log.exception("agent part %s failed to stop", part.name)
        for tree in self.trees.values():
            await tree.stop()
        if self._tasks:
            # Trees save their snapshots on the way out; a replica that hangs is cut off.
            _, pending = await asyncio.wait(self._tasks, timeout=30)
            for task in pending:
                await cancel_and_wait(task)
            await asyncio.gather(*self._tasks, return_exceptions=True)  # (their errors read)
        self._tasks = []
        for lane in self.lanes.values():
            await lane.close()
        events = sum(t.stats.events for t in self.trees.values())
        rebuilds = sum(sum(t.stats.rebuilds.values()) for t in self.trees.values())
        log.info("agent of %s stopped: events %d, rebuilds %d", self.region, events, rebuilds)

    def lane(self, name: str) -> ReplicaLane:
        return self.lanes[name]

    def tree(self, name: str) -> LiveTree:
        try:
            return self.trees[name]
        except KeyError:
            raise UsageError(
                f"no replica {name!r} here (this agent keeps {', '.join(self.trees)})"
            ) from None
