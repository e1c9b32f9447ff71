"""What the service says of the fleet after each round: the latest runs' findings, whoever
ran them, in the gauges and the alert rules' rows; each problem logged as it appears and
as it goes.

A `replag repair run` from the CLI fixes the keys a check found; until the next
scheduled check (`check_interval`) the service's `replag_divergent_keys` and the
divergence rule would still say what the check said. After every round (each probe
interval at least) the newest finished check or repair run of each group is read
from the store, and where it is newer than what the service knows, it becomes
the group's verdict (`group_health`, the gauges: divergent keys and keys not
compared). The health problems (the same as `GET /api/v1/health`'s) are compared
with the previous round's: one WARNING line when a problem appears, one INFO line
when it clears, never one per round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from replag.alerts.health import group_health, record_check
from replag.alerts.verdict import HealthProblem
from replag.config import Config
from replag.errors import StoreError
from replag.metrics import ServiceMetrics
from replag.replication.check_verdicts import VerdictCache
from replag.store import Store

log = logging.getLogger("replag.service")

ProblemKey = tuple[str, str | None, str | None, str | None, str | None]


class RoundFindings:
    """The latest runs into the gauges and `group_health`; problem changes into the log."""

    def __init__(
        self,
        config: Config,
        *,
        store: Store,
        metrics: ServiceMetrics,
        verdicts: VerdictCache,
        problems: Callable[[], list[HealthProblem]],
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.verdicts = verdicts
        self.problems = problems
        self._logged: dict[ProblemKey, HealthProblem] | None = None

    async def after_round(self) -> None:
        try:
            await asyncio.to_thread(self.adopt_runs)
        except StoreError as exc:
            log.debug("latest runs not read: %s", exc)
        try:
            await asyncio.to_thread(self.log_changes)
        except StoreError as exc:
            log.debug("health not judged: %s", exc)

    def adopt_runs(self) -> None:
        """Each configured group's newest finished run, where newer than its verdict."""
        groups = {g.name for g in self.config.topology.groups}
        known = group_health(self.store)
        for name, run in self.verdicts.groups(self.store).items():
            if name not in groups:
                continue
            self.metrics.divergent.labels(name).set(run.divergent)
            self.metrics.not_compared.labels(name).set(sum(n for _, n in run.not_compared))
            health = known.get(name)
            if health is None or (health.checked_ns < run.finished_ns):
                record_check(
                    self.store,
                    group=name,
                    divergent=run.divergent,
                    run_id=run.run_id,
                    error=None,
                    at_ns=run.finished_ns,
                )

    def log_changes(self) -> None:
        """A WARNING line per problem that appeared since the last round, an INFO line per
        problem gone (the first round logs what it finds)."""
        now = {p.key: p for p in self.problems()}
        before = self._logged or {}
        for key, problem in now.items():
            if key not in before:
                log.warning("problem (%s): %s", problem.severity, problem.message)
        for key, problem in before.items():
            if key not in now:
                log.info("problem gone: %s", problem.message)
        self._logged = now
