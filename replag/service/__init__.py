"""The long-running service, as small scheduled units the service wires together.

- `wiring`: `ReplagService`, which builds the units and runs them (start/stop).
- `scheduler`: `ScheduledUnit` (name, interval, run) and the `Scheduler`.
- `probing`: `ProbeRound`, one per source region.
- `replication`: `ReplicationSampling` and `ReplicationState` (latest samples,
  the matrix's replication cells, `/api/v1/replication`).
- `dynomite`: `DynomiteStatsRound` (and `/api/v1/dynomite`).
- `checks`: `ScheduledCheck`, one per replica group.
- `jobs`: `JobRunner` and `RepairJob` (checks and repairs, API or scheduled).
- `alerting`: `AlertEvaluation`; `retention`: `RetentionRound`.
"""

from replag.service.jobs import JobAction, RepairJob
from replag.service.wiring import ReplagService

__all__ = ["JobAction", "RepairJob", "ReplagService"]
