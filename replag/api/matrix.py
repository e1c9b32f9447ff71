"""The region matrix (`GET /api/v1/lag/matrix`), served from answers built off the event loop.

A dashboard (or a wall of them) asks for the matrix every few seconds, and with a
fleet behind one service the index changes several times a second (each source's
probe round adds windows). So a request does no store read and no per-group work
on the event loop: it finds the answer built for its (since, cluster), still right
while the index's generation is the one it was built at and the range's ends have
not crossed a window (`RangeEdges`), and sends its bytes. Otherwise one thread
builds the new answer (one per query however many ask) from per-pair cells cached
by their exact window sets, so a round of one source rebuilds one cell; requests
meanwhile get the previous answer, at most `RECENT_S` old, marked `"fresh": false`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from replag.alerts.thresholds import lag_bands_ms, loss_bands, pair_colour, worst
from replag.api import models
from replag.api.clusters import Cluster, cluster_regions, scope
from replag.api.errors import errors
from replag.api.params import Time, TimeRange
from replag.api.routes import Service
from replag.lagindex import LagIndex, LagSummary, RangeEdges
from replag.service import ReplagService

router = APIRouter(prefix="/api/v1")

# A request whose answer is being rebuilt waits this long for it, then takes the
# previous answer if it was current at most RECENT_S ago (marked `"fresh": false`).
FRESH_WAIT_S = 0.002
RECENT_S = 5.0
MAX_FAMILIES = 256  # answers kept, one per (since, cluster), the least recent dropped


@dataclass(frozen=True, slots=True)
class _Built:
    members: bytes  # regions, cells, thresholds: everything but the per-request head
    generation: int
    edges: RangeEdges
    config: object  # the configuration it was built with (a reload replaces it)
    at: float  # monotonic


class MatrixAnswers:
    """The latest matrix per (since, cluster) and the builds under way (one per family)."""

    def __init__(self) -> None:
        self._built: OrderedDict[Hashable, _Built] = OrderedDict()
        self._building: dict[Hashable, asyncio.Future[_Built]] = {}
        self._replication: tuple[object, str | None, bytes] | None = None
        self._cells: asyncio.Future[list[dict[str, Any]]] | None = None

    def current(
        self, family: Hashable, index: LagIndex, config: object, span: TimeRange
    ) -> _Built | None:
        built = self._built.get(family)
        if (
            built is not None
            and built.generation == index.generation
            and built.config is config
            and built.edges.hold(span.since_ns, span.until_ns)
        ):
            return built
        return None

    def recent(self, family: Hashable, config: object) -> _Built | None:
        built = self._built.get(family)
        if built is None or built.config is not config:
            return None
        return built if time.monotonic() - built.at <= RECENT_S else None

    async def build(
        self, family: Hashable, svc: ReplagService, span: TimeRange, cluster: str | None
    ) -> _Built:
        """The answer for `family` now, built in a thread; one build per family at a time."""
        running = self._building.get(family)
        if running is None:
            running = asyncio.ensure_future(
                run_in_threadpool(_build, svc, span.since_ns, span.until_ns, cluster)
            )
            self._building[family] = running
            running.add_done_callback(lambda done: self._finished(family, done))
        return await asyncio.shield(running)

    async def replication_cells(self, svc: ReplagService) -> list[dict[str, Any]]:
        if self._cells is None:
            self._cells = asyncio.ensure_future(run_in_threadpool(svc.replication_cells))
            self._cells.add_done_callback(self._cells_done)
        return await asyncio.shield(self._cells)

    def _cells_done(self, _: asyncio.Future[list[dict[str, Any]]]) -> None:
        self._cells = None

    def _finished(self, family: Hashable, done: asyncio.Future[_Built]) -> None:
        self._building.pop(family, None)
        if not done.cancelled() and done.exception() is None:
            self._built[family] = done.result()
            self._built.move_to_end(family)
            while len(self._built) > MAX_FAMILIES:  # `since` may be any time a client sends
                self._built.popitem(last=False)

    def replication(
        self, svc: ReplagService, cells: list[dict[str, Any]], cluster: str | None
    ) -> bytes:
        """The replication cells as JSON, encoded once per build of the cells and cluster."""
        cached = self._replication  # holding `cells` keeps its identity its own
        if cached is not None and cached[0] is cells and cached[1] == cluster:
            return cached[2]
        regions = cluster_regions(svc.config, cluster)
        chosen = [c for c in cells if regions is None or c["source"] in regions]
        encoded = json.dumps(chosen, separators=(",", ":")).encode()
        self._replication = (cells, cluster, encoded)
        return encoded


def answers_of(svc: ReplagService) -> MatrixAnswers:
    found: MatrixAnswers | None = getattr(svc, "matrix_answers", None)
    if found is None:
        found = MatrixAnswers()
        svc.matrix_answers = found  # type: ignore[attr-defined]
    return found


@router.get("/lag/matrix", response_model=models.Matrix, responses=errors(404))
async def lag_matrix(svc: Service, since: Time = None, cluster: Cluster = None) -> Response:
    """Region × region p50/p99/loss since `since` (default 15m), each cell with its colour
    (the worse of p99 and loss against the rules covering that pair) and bands;
    `replication`: per (source, target) the latest worst bytes behind, least backlog
    headroom and links down of the target's replicas. `cluster` keeps that cluster's
    regions only."""
    config = svc.config
    cluster_regions(config, cluster)  # 404 on an unknown cluster
    span = TimeRange.parse(since, None, now_ns=time.time_ns(), default_since_s=900)
    answers = answers_of(svc)
    index = svc.index
    family = (since, cluster)
    index.refresh(wait=False)  # a no-op under the service: its schedules follow the store
    built = answers.current(family, index, config, span)
    fresh = True
    if built is None:
        building = answers.build(family, svc, span, cluster)
        recent = answers.recent(family, config) if index.serve_recent else None
        if recent is None:
            built = await building
        else:
            try:
                built = await asyncio.wait_for(asyncio.shield(building), FRESH_WAIT_S)
            except TimeoutError:
                built, fresh = recent, False
    # Replication state changes apart from the lag windows: cells at most one
    # replication_interval old (older ones are rebuilt here, from the latest samples).
    cells = svc.recent_replication_cells()
    if cells is None:  # one build for every request that finds none (a store read)
        cells = await answers.replication_cells(svc)
    head = {
        "since_ns": span.since_ns,
        "until_ns": span.until_ns,
        "fresh": fresh and index.load_error is None,
        **({} if index.load_error is None else {"error": index.load_error}),
        **scope(config, cluster),
    }
    text = b"".join(
        (
            json.dumps(head, separators=(",", ":")).encode()[:-1],
            b',"replication":',
            answers.replication(svc, cells, cluster),
            b",",
            built.members,
            b"}",
        )
    )
    return Response(text, media_type="application/json")


def _build(svc: ReplagService, since_ns: int, until_ns: int, cluster: str | None) -> _Built:
    """The matrix members for the range, from per-pair cells cached by their window sets."""
    index = svc.index
    config = svc.config
    regions = cluster_regions(config, cluster)
    generation, signature, edges = index.edges(since_ns=since_ns, until_ns=until_ns)
    replicas: dict[tuple[str, str], list[str]] = {}
    for source, target, replica in index.replicas():
        replicas.setdefault((source, target), []).append(replica)
    cells = []
    for source, target, pair_generation, lo, hi in signature:
        if hi <= lo or (regions is not None and source not in regions):
            continue
        chosen = tuple(replicas.get((source, target), ()))
        key = ("matrix-cell", svc.config_version, source, target, pair_generation, lo, hi, chosen)
        cells.append(
            index.answer(
                key,
                partial(_pair_cell, svc, source, target, chosen, since_ns, until_ns),
            )
        )
    names = [r.name for r in config.topology.regions]
    for source, target in index.pairs():
        names += [n for n in (source, target) if n not in names]
    if regions is not None:
        names = [n for n in names if n in regions]
    members = json.dumps(
        {
            "regions": names,
            "thresholds_ms": lag_bands_ms(config).to_dict(),
            "loss_thresholds": loss_bands(config).to_dict(),
        },
        separators=(",", ":"),
    ).encode()[1:-1]
    members += b',"cells":[' + b",".join(cells) + b"]"
    return _Built(members, generation, edges, config, time.monotonic())


def _pair_cell(
    svc: ReplagService,
    source: str,
    target: str,
    replicas: tuple[str, ...],
    since_ns: int,
    until_ns: int,
) -> bytes:
    """One pair's cell with its replicas' cells, as JSON."""
    index = svc.index
    s = index.summary(source, target, since_ns=since_ns, until_ns=until_ns)
    per_replica = [
        _cell(svc, summary, replica=r)
        for r in replicas
        if (
            summary := index.summary(
                source, target, since_ns=since_ns, until_ns=until_ns, replica=r
            )
        ).sent
    ]
    cell = _cell(svc, s, replica=None)
    # A region is never greener than its worst replica: one silent rack of three
    # loses a third of the probes, and is red all the same.
    cell["colour"] = worst([cell["colour"], *(r["colour"] for r in per_replica)])
    return json.dumps({**cell, "replicas": per_replica}, separators=(",", ":")).encode()


def _cell(svc: ReplagService, s: LagSummary, *, replica: str | None) -> dict[str, Any]:
    """One matrix cell (a pair, or one replica of it) with its colour and bands."""
    out: dict[str, Any] = {"source": s.source, "target": s.target}
    if replica is not None:
        out["replica"] = replica
    return {
        **out,
        "p50_ms": s.lag_ms["p50"],
        "p99_ms": s.lag_ms["p99"],
        "max_ms": s.lag_ms["max"],
        "sent": s.sent,
        "seen": s.seen,
        "lost": s.lost,
        "loss_ratio": round(s.loss_ratio, 6),
        **pair_colour(
            svc.config,
            s.source,
            s.target,
            p99_ms=s.lag_ms["p99"],
            sent=s.sent,
            lost=s.lost,
            replica=replica,
        ),
    }
