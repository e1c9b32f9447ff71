"""How far a probe run is, for a status line: keys written, then arrivals seen."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ProbeProgress:
    """Where a run is: `phase` "writing" (done = keys written) or "waiting" (done = arrivals
    seen, over every replica or Dynomite rack), out of `total`."""

    source: str
    phase: str
    done: int
    total: int


ProgressCallback = Callable[[ProbeProgress], None]


def waiting_reporter(progress: ProgressCallback, source: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        progress(ProbeProgress(source=source, phase="waiting", done=done, total=total))

    return report
