"""Progress events of a check or repair run, for a status line or the API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RepairProgress:
    """A progress event: `done` of `total` (None = unknown) in `phase` of `replica`."""

    group: str
    replica: str
    phase: str
    done: int
    total: int | None
    rate: float

    @property
    def eta_s(self) -> float | None:
        if self.total is None or self.rate <= 0:
            return None
        return max(0.0, (self.total - self.done) / self.rate)


ProgressCallback = Callable[[RepairProgress], None]
