"""The state of one check or repair run: what it was asked, what of the config it reads,
where it is recorded, whom it tells. `engine` builds it once; the steps read it.

`RunSetup` is the slice of the config a run reads, taken when it starts (the topology,
the settings, the agents' token, the file's name for the resume command), so the
`Config` itself goes no further than `engine.check`/`engine.repair`. `RunState` adds
the run's own parts: its parameters, its id and log in the store, the agents' clients,
the progress and divergent-key callbacks. Below a group's run (`GroupRun`), the steps
are handed narrow values (scan options, page options, a group), never this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from replag.config import Config
from replag.repair.keyspace.progress import ProgressCallback
from replag.repair.runs import RunLog
from replag.repair.trees.remote import AgentPool
from replag.settings import Settings
from replag.topology import Endpoint, Topology

# Receives (group, key, the divergent key's dict) as a check finds each one.
KeySink = Callable[[str, bytes, dict[str, Any]], None]


@dataclass(frozen=True, kw_only=True)
class RunParams:
    """What a run was asked to do: stored with it, and read back by `--resume`."""

    kind: str
    group: str | None
    policy: str | None  # None: each group's kind's default
    dry_run: bool
    allow_deletes: bool
    rate: float | None
    max_inflight: int
    match: str | None
    type_filter: str | None
    # "compare" or "ignore" (settings.repair_ttls); runs saved before it compared.
    ttls: str = "compare"
    # Who started it through the API (token name, client address, job id); None otherwise.
    started_by: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def filtered(self) -> bool:
        """A --match/--type run: its scans are filtered, so every member is read directly."""
        return self.match is not None or self.type_filter is not None


@dataclass(frozen=True, kw_only=True)
class RunSetup:
    """What a run reads of the config (`of`), taken once when it starts."""

    topology: Topology
    settings: Settings
    agent_token: str | None
    config_name: str | None  # the config file, named in the command that resumes the run

    @classmethod
    def of(cls, config: Config) -> RunSetup:
        return cls(
            topology=config.topology,
            settings=config.settings,
            agent_token=config.agent_token(),
            config_name=str(config.path) if config.path is not None else None,
        )


@dataclass(frozen=True, kw_only=True)
class RunState:
    """One run under way: built by `engine` once its id is known, read by its steps."""

    setup: RunSetup
    params: RunParams
    run_id: str
    log: RunLog | None  # None: no store, nothing recorded
    agents: AgentPool
    progress: ProgressCallback | None = None
    key_sink: KeySink | None = None
    # Verify (and repair) only these keys, scan nothing: a rebuild's closing pass. Not
    # stored: a resumed run scans (finding more, never less).
    keys: Sequence[bytes] | None = None

    def through_agent(self, member: Endpoint) -> bool:
        """Whether `member` is compared through its region's agent (a --match/--type run
        scans every member directly: see `GroupRun`)."""
        return self.setup.topology.agent_of(member) is not None and not self.params.filtered
