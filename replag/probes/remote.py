"""Arrivals seen by a region agent, brought onto the prober's clock with their error bound.

The prober's half of lag through agents. An agent reports each arrival on its
own wall clock (`ArrivalWatch.report`); the offset θ of that clock against the
prober's is known to lie in an interval (`replag.clockbound`: the kernels'
bounds, intersected with a round trip's). An arrival at agent time A in
[A_lo, A_hi] happened at prober wall time A − θ, so within
[A_lo − θ_hi, A_hi − θ_lo]: the sample's bracket grows by the clock bound on
each side, and its estimate moves by the offset's midpoint. The prober then
maps wall time to its monotonic clock (widened by how far that mapping moved
during the run) and `RemoteObserver.arrivals` are `Arrival`s like any other
observer's, so the runner's lag arithmetic is the same for every sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replag.clockbound import OffsetInterval
from replag.probes.observers import Arrival, Observer
from replag.topology import Endpoint


@dataclass(frozen=True, slots=True)
class ProberMapping:
    """The prober's wall − monotonic during a run: `wall_minus_mono_ns` read last, and how
    uncertain it is (`uncertainty_ns`: read jitter plus its movement since the run began)."""

    wall_minus_mono_ns: int
    uncertainty_ns: int


class RemoteObserver(Observer):
    """A replica watched by its region's agent; `absorb` fills `arrivals` from its report."""

    def __init__(self, replica: Endpoint, *, stem: bytes, agent: str) -> None:
        super().__init__(replica)
        self.stem = stem
        self.agent = agent
        self.mode = "agent"
        self.remote_mode: str | None = None
        self.notes: list[str] = []
        self.final = False

    async def start(self) -> None:
        """Nothing: the agent's watch already runs (opened before the first write)."""

    async def stop(self) -> None:
        """Nothing here: the region's watch is closed once, for all its replicas."""

    def absorb(
        self,
        row: dict[str, Any],
        *,
        base_ns: int,
        offset: OffsetInterval,
        prober: ProberMapping,
    ) -> None:
        """One replica's entry of an agent report, onto the prober's monotonic clock."""
        self.remote_mode = row.get("observed_by")
        if self.remote_mode:
            self.mode = f"agent/{self.remote_mode}"
        self.error = row.get("error")
        self.notes = list(row.get("notes") or [])
        to_mono = base_ns - prober.wall_minus_mono_ns
        widen = prober.uncertainty_ns
        for seq, estimate, lo, hi in row.get("arrivals", []):
            self.arrivals[self.stem + str(int(seq)).encode()] = Arrival(
                estimate_ns=to_mono + int(estimate) - offset.estimate_ns,
                lo_ns=to_mono + int(lo) - offset.hi_ns - widen,
                hi_ns=to_mono + int(hi) - offset.lo_ns + widen,
            )
