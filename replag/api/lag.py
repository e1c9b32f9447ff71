"""The lag endpoints: merged percentiles, the region matrix, and chart series.

The replica is the unit: every pair (source region → target region) carries its
replicas' own figures (`replicas`), and is their roll-up (every replica's
windows merged), coloured never better than its worst replica; a series is a
pair's or, with `replica`, one replica's.

Answers are cached as JSON bytes keyed by the exact set of windows they cover
(`LagIndex.signature`), so a dashboard polling "the last 24 h" costs a cache
lookup until a window arrives or ages out. A cache hit is served on the event
loop; a miss is computed in a thread so it never stalls probing, and under
`replag serve` (probe rounds add windows every second or so), while it takes
over `FRESH_WAIT_S`, the same query's previous answer (current at most
`RECENT_S` ago) is served, marked `"fresh": false`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Hashable
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from replag.api import models
from replag.api.clusters import Cluster, cluster_regions, scope
from replag.api.errors import errors
from replag.api.params import Step, Time, TimeRange
from replag.api.routes import Service
from replag.errors import NotFound
from replag.lagindex import LagIndex, NotCached
from replag.service import ReplagService

router = APIRouter(prefix="/api/v1")
Region = Annotated[str | None, Query(max_length=200, description="a region name")]
Replica = Annotated[
    str | None,
    Query(max_length=200, description="a replica's name (or a Dynomite rack's), as in `replicas`"),
]


# Where the service's schedules run (`LagIndex.serve_recent`), a cache miss is waited
# for this long; after that, the same query's previous answer is served if it was
# current at most RECENT_S ago (marked `"fresh": false`) while the new one is computed.
# A probe round adds a window to every pair about once a second, and on a busy host
# the recomputation can take tens of milliseconds.
FRESH_WAIT_S = 0.002
RECENT_S = 5.0


async def _cached(
    index: LagIndex, key: Hashable, family: Hashable, build: Callable[[], bytes]
) -> tuple[bytes, bool]:
    """(answer, fresh): the answer for `key` (the query and the exact windows it covers)
    from the cache, else computed in the thread pool, off the event loop; if that takes
    over FRESH_WAIT_S and the index allows it, the query's recent previous answer, with
    fresh False."""
    try:
        body = index.answer(key, build, may_compute=False)
    except NotCached:
        computing = asyncio.ensure_future(run_in_threadpool(index.answer, key, build))
        recent = None
        if index.serve_recent:
            done, _ = await asyncio.wait({computing}, timeout=FRESH_WAIT_S)
            recent = None if done else index.recent(family, max_age_s=RECENT_S)
        if recent is not None:
            computing.add_done_callback(partial(_remember, index, family))
            previous: bytes = recent
            return previous, False
        body = await computing
    index.remember(family, body)
    return body, True


def _remember(index: LagIndex, family: Hashable, computed: asyncio.Future[bytes]) -> None:
    if not computed.cancelled() and computed.exception() is None:
        index.remember(family, computed.result())


def _json(head: dict[str, Any], body: bytes) -> Response:
    """`head` (per request: the resolved range) spliced before the cached `body` members."""
    text = json.dumps(head, separators=(",", ":")).encode()[:-1] + b"," + body + b"}"
    return Response(text, media_type="application/json")


def _members(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()[1:-1]


def _regions(svc: ReplagService) -> list[str]:
    names = [r.name for r in svc.config.topology.regions]
    for source, target in svc.index.pairs():
        names += [n for n in (source, target) if n not in names]
    return names


def _check_region(svc: ReplagService, name: str | None, *, param: str) -> None:
    if name is not None and name not in (known := _regions(svc)):
        raise NotFound(f"{param}: unknown region {name!r} (known: {', '.join(known)})")


def _replicas_of(svc: ReplagService) -> dict[tuple[str, str], list[str]]:
    """(source, target) → its replicas with a window ever. A new replica comes with a new
    window of its pair, so the pair's signature (the cache key) covers them too."""
    out: dict[tuple[str, str], list[str]] = {}
    for source, target, replica in svc.index.replicas():
        out.setdefault((source, target), []).append(replica)
    return out


def _check_replica(svc: ReplagService, name: str | None) -> None:
    if name is None:
        return
    known = sorted({r for _, _, r in svc.index.replicas()})
    if name not in known:
        raise NotFound(f"replica: unknown replica {name!r} (known: {', '.join(known) or 'none'})")


@router.get("/lag", response_model=models.Lag, responses=errors(404, 503))
async def lag(
    svc: Service,
    source: Region = None,
    target: Region = None,
    replica: Replica = None,
    since: Time = None,
    until: Time = None,
    cluster: Cluster = None,
) -> Response:
    """Merged percentiles, count and loss per (source, target) over the range (default 15m),
    each with `replicas`: the same figures per replica (`replica` keeps that one only);
    `cluster` keeps the pairs whose source is one of that cluster's regions."""
    regions = cluster_regions(svc.config, cluster)
    _check_region(svc, source, param="source")
    _check_region(svc, target, param="target")
    _check_replica(svc, replica)
    span = TimeRange.parse(since, until, now_ns=time.time_ns(), default_since_s=900)
    signature = svc.index.signature(since_ns=span.since_ns, until_ns=span.until_ns)
    replicas = _replicas_of(svc)
    chosen = [
        (s, t, [r for r in replicas.get((s, t), []) if replica in (None, r)])
        for s, t, _, lo, hi in signature
        if hi > lo
        and source in (None, s)
        and target in (None, t)
        and (regions is None or s in regions)
    ]

    def build() -> bytes:
        pairs = []
        for s, t, names in chosen:
            per_replica = [
                svc.index.summary(
                    s, t, since_ns=span.since_ns, until_ns=span.until_ns, replica=r
                ).to_dict()
                for r in names
            ]
            per_replica = [r for r in per_replica if r["sent"]]
            if replica is not None and not per_replica:
                continue
            pair = svc.index.summary(s, t, since_ns=span.since_ns, until_ns=span.until_ns)
            pairs.append({**pair.to_dict(), "replicas": per_replica})
        return _members({"pairs": pairs})

    family = ("lag", source, target, replica, since, until, cluster)
    body, fresh = await _cached(svc.index, (*family, signature), family, build)
    return _json(
        {
            "since_ns": span.since_ns,
            "until_ns": span.until_ns,
            "fresh": fresh and svc.index.load_error is None,
            **_index_error(svc),
            **scope(svc.config, cluster),
        },
        body,
    )


@router.get("/lag/series", response_model=models.Series, responses=errors(404, 503))
async def lag_series(
    svc: Service,
    source: Annotated[str, Query(max_length=200)],
    target: Annotated[str, Query(max_length=200)],
    replica: Replica = None,
    since: Time = None,
    until: Time = None,
    step: Step = None,
) -> Response:
    """Percentiles per epoch-aligned step (default range 1h) for charts: the pair's, or with
    `replica` that replica's."""
    _check_region(svc, source, param="source")
    _check_region(svc, target, param="target")
    _check_replica(svc, replica)
    span = TimeRange.parse(since, until, now_ns=time.time_ns(), default_since_s=3600)
    step_ns = span.step_ns(step, minimum_s=svc.settings.window)
    signature = [
        entry
        for entry in svc.index.signature(since_ns=span.since_ns, until_ns=span.until_ns)
        if entry[:2] == (source, target)
    ]

    def build() -> bytes:
        series = svc.index.series(
            source,
            target,
            since_ns=span.since_ns,
            until_ns=span.until_ns,
            step_ns=step_ns,
            replica=replica,
        )
        points = [
            {
                "t_ns": start,
                "p50_ms": s.lag_ms["p50"],
                "p90_ms": s.lag_ms["p90"],
                "p99_ms": s.lag_ms["p99"],
                "max_ms": s.lag_ms["max"],
                "sent": s.sent,
                "seen": s.seen,
                "lost": s.lost,
            }
            for start, s in series
        ]
        return _members(
            {
                "source": source,
                "target": target,
                "replica": replica,
                "step_s": step_ns / 1e9,
                "points": points,
            }
        )

    family = ("series", source, target, replica, since, until, step_ns)
    body, fresh = await _cached(svc.index, (*family, tuple(signature)), family, build)
    return _json(
        {
            "since_ns": span.since_ns,
            "until_ns": span.until_ns,
            "fresh": fresh and svc.index.load_error is None,
            **_index_error(svc),
        },
        body,
    )


def _index_error(svc: ReplagService) -> dict[str, str]:
    """`{"error": …}` when the lag index could not read the store (its figures are partial)."""
    return {} if svc.index.load_error is None else {"error": svc.index.load_error}
