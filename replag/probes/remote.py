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

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replag.clockbound import (
    ClockComparison,
    HostClock,
    OffsetInterval,
    WallClock,
    compare_clocks,
    host_clock,
    round_trip_interval,
)
from replag.errors import AgentError
from replag.probes.observers import Arrival, Observer
from replag.repair.trees.remote import AgentClient
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
        merged = {int(seq) for seq in row.get("merged", [])}
        prompt = {int(seq) for seq in row.get("prompt", [])}
        loop = {int(seq) for seq in row.get("loop", [])}
        widened = {int(seq): int(ns) for seq, ns in row.get("widened", [])}
        for seq, estimate, lo, hi in row.get("arrivals", []):
            self.arrivals[self.stem + str(int(seq)).encode()] = Arrival(
                estimate_ns=to_mono + int(estimate) - offset.estimate_ns,
                lo_ns=to_mono + int(lo) - offset.hi_ns - widen,
                hi_ns=to_mono + int(hi) - offset.lo_ns + widen,
                merged=int(seq) in merged,
                prompt=int(seq) in prompt,
                kernel=int(seq) not in loop,
                widened_ns=widened.get(int(seq), 0),
            )


class RegionWatch:
    """One probe run's keys watched by one region's agent, from the prober's side.

    `open()` before the first write (the agent subscribes first); `sample_clock()` while
    writing; `finish(wait_s)` once written: one long poll for the arrivals, round trips
    for the clock again, then every `RemoteObserver` is filled and the watch closed. Any
    failure of the agent becomes each observer's error (its keys count as lost, the
    replica as unreachable), never an exception out of the run.
    """

    ROUNDS = 3

    def __init__(
        self,
        client: AgentClient,
        *,
        region: str,
        replicas: Sequence[Endpoint],
        spec: dict[str, Any],
        stem: bytes,
        ours_bound_s: float | None,
    ) -> None:
        self.client, self.region, self.spec = client, region, spec
        self.observers = {
            ep.name: RemoteObserver(ep, stem=stem, agent=client.url) for ep in replicas
        }
        self._ours_bound_s = ours_bound_s
        self.watch_id: str | None = None
        self.theirs: HostClock | None = None
        self.ours: HostClock | None = None
        self._start: list[OffsetInterval] = []
        self._end: list[OffsetInterval] = []
        self._mapping_start = WallClock().wall_minus_monotonic()
        self.comparison: ClockComparison | None = None
        self.error: str | None = None

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, wait_s: float = 0.0
    ) -> tuple[dict[str, Any], OffsetInterval | None]:
        """The answer, and the round-trip interval of its clock reading (if it has one)."""
        sent = time.time_ns()
        data, _ = await self.client.request(method, path, body, wait_s=wait_s)
        received = time.time_ns()
        try:
            answer = json.loads(data)
            clock = answer.get("clock")
            interval = None
            if clock is not None:
                self.theirs = HostClock.from_dict(clock["host"])
                interval = round_trip_interval(int(clock["now_ns"]), sent, received)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise AgentError(
                f"bad answer to {method} {path}: {exc}", where=self.client.url
            ) from None
        return answer, interval

    async def open(self) -> None:
        """Open the watch; AgentError if the agent cannot (the caller observes directly)."""
        self.ours = host_clock(self._ours_bound_s)
        answer, interval = await self._call("POST", "/lag/watches", self.spec)
        self.watch_id = str(answer["watch"])
        if interval is not None:
            self._start.append(interval)
        reported = {row.get("name"): row for row in answer.get("replicas", [])}
        for name, observer in self.observers.items():
            row = reported.get(name)
            if row is None:
                observer.error = (
                    f"the agent of {self.region} ({self.client.url}) does not watch {name} "
                    f"(it watches {', '.join(str(n) for n in reported) or 'nothing'})"
                )
            elif row.get("error"):
                observer.error = f"agent of {self.region}: {row['error']}"
            observer.remote_mode = row.get("observed_by") if row else None

    async def sample_clock(self, *, end: bool = False) -> None:
        """A few round trips (`GET /lag/clock`); failures leave fewer samples, not an error."""
        into = self._end if end else self._start
        for _ in range(self.ROUNDS):
            try:
                _, interval = await self._call("GET", "/lag/clock")
            except AgentError:
                return
            if interval is not None:
                into.append(interval)

    async def finish(self, wait_s: float) -> None:
        """Fetch the arrivals (waiting up to `wait_s` on the agent's side), then close."""
        try:
            if self.watch_id is None:
                raise AgentError("no watch open", where=self.client.url)
            report, _ = await self._call(
                "GET", f"/lag/watches/{self.watch_id}?wait_s={max(wait_s, 0):.3f}", wait_s=wait_s
            )
            await self.sample_clock(end=True)
            self.comparison = self._compare()
            if self.comparison.interval is None:
                raise AgentError("no clock comparison possible", where=self.client.url)
            mapping, read_unc = WallClock().wall_minus_monotonic()
            moved = abs(mapping - self._mapping_start[0]) + self._mapping_start[1] + read_unc
            prober = ProberMapping(wall_minus_mono_ns=mapping, uncertainty_ns=moved)
            rows = {row.get("name"): row for row in report.get("replicas", [])}
            for name, observer in self.observers.items():
                if name in rows:
                    observer.absorb(
                        rows[name],
                        base_ns=int(report["base_ns"]),
                        offset=self.comparison.interval,
                        prober=prober,
                    )
        except (AgentError, KeyError, TypeError, ValueError) as exc:
            text = exc.message if isinstance(exc, AgentError) else f"bad report: {exc}"
            self.error = f"agent of {self.region} ({self.client.url}): {text}"
            for observer in self.observers.values():
                observer.error = observer.error or self.error
        finally:
            for observer in self.observers.values():
                observer.final = True
            await self.close()

    def _compare(self) -> ClockComparison:
        assert self.ours is not None
        theirs = self.theirs or HostClock(
            synchronised=False, maxerror_ns=None, esterror_ns=None, source="unavailable"
        )
        ours_end = host_clock(self._ours_bound_s)
        parts = []
        for samples, ours in ((self._start, self.ours), (self._end, ours_end)):
            # Every round trip's interval holds the offset: together, their intersection.
            trip: OffsetInterval | None = None
            for interval in samples:
                meet = interval if trip is None else trip.intersect(interval)
                trip = meet if meet is not None else trip
            parts.append(compare_clocks(ours, theirs, trip))
        first, last = parts
        if first.interval is None or last.interval is None:
            return first if first.interval is not None else last
        # The offset may drift during the run: whatever it was lies in the hull.
        interval = first.interval.hull(last.interval)
        note = first.note or last.note
        source = first.source if first.source == last.source else f"{first.source}/{last.source}"
        return ClockComparison(interval=interval, source=source, note=note)

    async def close(self) -> None:
        if self.watch_id is None:
            return
        watch_id, self.watch_id = self.watch_id, None
        with contextlib.suppress(AgentError):
            await self.client.request("DELETE", f"/lag/watches/{watch_id}")

    def to_dict(self) -> dict[str, Any]:
        """What the run's report says about this agent and the clocks."""
        return {
            "region": self.region,
            "agent": self.client.url,
            "replicas": list(self.observers),
            "clock": self.comparison.to_dict() if self.comparison else None,
            "prober_clock": self.ours.to_dict() if self.ours else None,
            "agent_clock": self.theirs.to_dict() if self.theirs else None,
            "error": self.error,
        }
