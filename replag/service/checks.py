"""The scheduled check of one replica group, every `check_interval`.

One `ScheduledCheck` per group; a check already running for the group (one
the API started) makes this round skip it. The scheduled checks of one
service take turns (`turns`), as one group after the other, so a fleet's
checks never scan every group at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from replag.errors import JobConflict, ReplagError
from replag.service.jobs import JobRunner
from replag.service.leasing import Fence
from replag.service.scheduler import Claim

log = logging.getLogger("replag.service")


class ScheduledCheck:
    """Checks one group through the job runner (auto-repairing when the settings say so)."""

    claim: Claim = "slot"  # one instance per check_interval slot

    def __init__(
        self,
        group: str,
        *,
        jobs: JobRunner,
        turns: asyncio.Semaphore,
        evaluate_alerts: Callable[[], Awaitable[None]],
    ) -> None:
        self.group = group
        self.name = f"check:{group}"
        self.interval_s = jobs.settings.check_interval
        self.jobs = jobs
        self.turns = turns
        self.evaluate_alerts = evaluate_alerts

    async def run(self, fence: Fence | None = None) -> None:
        async with self.turns:
            await self.check()
        await self.evaluate_alerts()

    async def check(self) -> None:
        """Check the group unless a job of it (or of every group) runs."""
        try:
            job = self.jobs.start("check", self.group)
        except JobConflict:
            return
        except ReplagError as exc:
            log.warning("check of %s not started: %s", self.group, exc)
            return
        await self.jobs.wait(job.id)
