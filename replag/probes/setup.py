"""What one probe run reads of the config, taken once when it starts (`ProbeSetup.of`).

The topology (where to write, whom to watch, the Sentinels and shards to follow), the
run's settings (the config's, with the run's own count, rate, mode and timeout), and the
token the region agents are asked with. `run_probe` takes it from the `Config`; below
it the probe's parts (following a shard or a Sentinel, the replication sampler, the
targets, the agents' watches) get this or narrower values, never the config, as
repair's `RunSetup` does for a check or repair run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from replag.config import Config
from replag.settings import Settings
from replag.topology import Topology

if TYPE_CHECKING:
    from replag.repair.trees.remote import AgentClient


@dataclass(frozen=True, kw_only=True)
class ProbeSetup:
    """What a probe run reads of the config (`of`)."""

    topology: Topology
    settings: Settings
    agent_token: str | None

    @classmethod
    def of(
        cls,
        config: Config,
        *,
        count: int | None = None,
        rate: float | None = None,
        mode: str | None = None,
        timeout_s: float | None = None,
    ) -> ProbeSetup:
        return cls(
            topology=config.topology,
            settings=config.settings.replace(count=count, rate=rate, mode=mode, timeout=timeout_s),
            agent_token=config.agent_token(),
        )

    def agent_client(self, region_name: str, *, run_id: str) -> AgentClient | None:
        """The client of `region_name`'s agent (None when it runs none)."""
        # Only runs with agents load their HTTP client (and what it brings: aiohttp, numpy).
        from replag.repair.trees.remote import region_agent_client

        return region_agent_client(
            self.topology.region(region_name),
            token=self.agent_token,
            timeout_s=self.settings.connect_timeout,
            run_id=run_id,
        )
