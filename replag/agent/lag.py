"""The agent's lag part: it watches probe keys arrive on its region's replicas for a prober.

Routes (a token with the read scope, like every route but health; `agent.auth`):

* `POST /agent/v1/lag/watches` {run_id, stem, count, pattern, mode, timeout_s}: open a
  watch of keys `stem` + 0 … count−1 on every replica of the region (local addresses);
  answers its id, each replica's observation mode or error, and the clock;
* `GET /agent/v1/lag/watches/{id}?wait_s=S`: once every key arrived everywhere, or after
  S seconds (a long poll: one WAN round trip), the arrivals on this host's wall clock;
* `DELETE /agent/v1/lag/watches/{id}`: stop it (it also ends itself after `timeout_s`);

A watch is its opener's: only the token that opened it may read or close it (another
gets 404), and one token holds at most `agent_watches_per_token` at once (429).
* `GET /agent/v1/lag/clock`: {clock: {now_ns, host}}: this host's wall clock now, and
  what the kernel (or `clock_error_bound`) says of its error, for the prober's round trips.

The clock is read as late as the answer allows; with `--clock-offset` (lab and
tests only) it runs that far from the host's, to show the prober's bounds hold.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from pydantic import BaseModel, ConfigDict, Field

from replag.agent.auth import Caller, reader
from replag.clockbound import WallClock, host_clock
from replag.errors import UsageError
from replag.probes.watch import MAX_KEYS, WatchBook, WatchSpec
from replag.settings import PROBE_MODES

if TYPE_CHECKING:
    from replag.agent.region import RegionAgent


Reader = Annotated[Caller, Depends(reader)]


class WatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: str = Field(min_length=1, max_length=64)
    stem: str = Field(min_length=1, max_length=1024, description="base64 of the key stem")
    count: int = Field(ge=1, le=MAX_KEYS)
    pattern: str = Field(min_length=1, max_length=1024, description="base64 of the glob")
    mode: str = "auto"
    timeout_s: float = Field(default=60.0, gt=0, le=3600)


class LagPart:
    """An `AgentPart`: probe-key arrival watches on the agent's region's replicas."""

    name = "lag"

    def __init__(self, *, clock: WallClock | None = None) -> None:
        self.clock = clock or WallClock()
        self.book: WatchBook | None = None
        self.opened_by: dict[str, dict[str, str]] = {}  # watch id → who opened it
        self.owner: dict[str, str] = {}  # watch id → the token's name: only it may see it
        self.per_token = 16  # settings.agent_watches_per_token, once started
        self._bound_s: float | None = None
        self.router: APIRouter | None = self._routes()

    async def start(self, agent: RegionAgent) -> None:
        settings = agent.settings
        replicas = agent.config.topology.region(agent.region).replicas
        self._bound_s = settings.clock_error_bound
        self.per_token = settings.agent_watches_per_token
        self.book = WatchBook(replicas, settings, clock=self.clock)

    async def stop(self) -> None:
        if self.book is not None:
            await self.book.close_all()

    def clock_now(self) -> dict[str, Any]:
        host = host_clock(self._bound_s).to_dict()
        return {"host": host, "now_ns": self.clock.now_ns()}

    def _book(self) -> WatchBook:
        if self.book is None:
            raise HTTPException(503, "the lag part has not started")
        return self.book

    def _routes(self) -> APIRouter:
        router = APIRouter(prefix="/agent/v1/lag")

        @router.post("/watches")
        async def open_watch(body: WatchRequest, caller: Reader) -> dict[str, Any]:
            """Watch a probe run's keys on this region's replicas (before the writes)."""
            if body.mode not in PROBE_MODES:
                raise HTTPException(400, f"mode: one of {', '.join(PROBE_MODES)}")
            try:
                spec = WatchSpec(
                    run_id=body.run_id,
                    stem=base64.b64decode(body.stem, validate=True),
                    count=body.count,
                    pattern=base64.b64decode(body.pattern, validate=True),
                    mode=body.mode,
                    timeout_s=body.timeout_s,
                )
            except ValueError:
                raise HTTPException(400, "stem, pattern: expected base64") from None
            book = self._book()
            self.opened_by = {k: v for k, v in self.opened_by.items() if k in book.watches}
            self.owner = {k: v for k, v in self.owner.items() if k in book.watches}
            held = sum(1 for name in self.owner.values() if name == caller.name)
            if held >= self.per_token:
                raise HTTPException(
                    429,
                    f"token {caller.name!r} already holds {held} watches "
                    f"(agent_watches_per_token); close one or let it end",
                )
            try:
                watch = await book.open(spec)
            except UsageError as exc:
                raise HTTPException(400, exc.message) from None
            self.opened_by[watch.id] = caller.to_dict()
            self.owner[watch.id] = caller.name
            report = watch.report()
            return {
                "watch": watch.id,
                "replicas": report["replicas"],
                "opened_by": caller.to_dict(),
                "clock": self.clock_now(),
            }

        @router.get("/watches/{watch_id}")
        async def watch_report(
            watch_id: str, caller: Reader, wait_s: Annotated[float, Query(ge=0, le=3600)] = 0.0
        ) -> dict[str, Any]:
            """The arrivals so far, once complete or after `wait_s`."""
            watch = self._watch(watch_id, caller)
            await watch.wait(wait_s)
            opened_by = self.opened_by.get(watch_id)
            return {**watch.report(), "opened_by": opened_by, "clock": self.clock_now()}

        @router.delete("/watches/{watch_id}")
        async def close_watch(watch_id: str, caller: Reader) -> dict[str, Any]:
            self._watch(watch_id, caller)
            await self._book().close(watch_id)
            return {"closed": watch_id}

        @router.get("/clock")
        async def clock() -> dict[str, Any]:
            """This host's wall clock and its error bound, for the prober's round trips."""
            return {"clock": self.clock_now()}

        return router

    def _watch(self, watch_id: str, caller: Caller) -> Any:
        """The watch, if `caller`'s token opened it: another token's is answered as one
        that does not exist (404), so a token learns nothing of other callers' watches."""
        try:
            watch = self._book().get(watch_id)
        except UsageError as exc:
            raise HTTPException(404, exc.message) from None
        if self.owner.get(watch_id) != caller.name:
            raise HTTPException(404, f"no watch {watch_id!r} (ended, or never opened)")
        return watch

    def collect(self) -> Iterator[Metric]:
        book = self.book
        open_now = GaugeMetricFamily("replag_agent_lag_watches", "Probe-run watches open now.")
        open_now.add_metric([], len(book.watches) if book else 0)
        opened = CounterMetricFamily("replag_agent_lag_watches_opened", "Probe-run watches opened.")
        opened.add_metric([], book.opened if book else 0)
        expired = CounterMetricFamily(
            "replag_agent_lag_watches_expired",
            "Watches ended by their own timeout (the prober never closed them).",
        )
        expired.add_metric([], book.expired if book else 0)
        host = host_clock(self._bound_s)
        synced = GaugeMetricFamily(
            "replag_agent_clock_synchronised",
            "1 when this host's clock has an error bound (kernel synchronised, or stated).",
        )
        synced.add_metric([], 1 if host.bound_ns is not None else 0)
        yield from (open_now, opened, expired, synced)
        if host.bound_ns is not None:
            bound = GaugeMetricFamily(
                "replag_agent_clock_maxerror_seconds",
                "Most this host's clock may be off true time (adjtimex maxerror or stated).",
            )
            bound.add_metric([], host.bound_ns / 1e9)
            yield bound
