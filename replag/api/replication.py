"""The replication endpoints: each primary's latest state with its failover RPO, and a
replica's bytes behind and backlog headroom as a series (from the store's samples)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query

from replag.api import models
from replag.api.clusters import Cluster, cluster_regions, keeps, scope
from replag.api.errors import errors
from replag.api.params import Step, Time, TimeRange
from replag.api.routes import Service
from replag.errors import NotFound
from replag.replication import history

router = APIRouter(prefix="/api/v1")


@router.get("/replication", response_model=models.Replication, responses=errors(404))
def replication(svc: Service, cluster: Cluster = None) -> dict[str, Any]:
    """Per primary (region or shard): offset, write rate, backlog, resyncs, read skew, and
    per replica: bytes behind (± the bytes written while reading), link, backlog headroom;
    `failover`: the replicas ranked by what a failover to each would lose now (RPO bytes
    and seconds) and the safest; `failovers`: Sentinel failovers followed in the last day.
    `cluster` keeps the primaries (and failovers) of that cluster's regions."""
    regions = cluster_regions(svc.config, cluster)
    out = {**svc.replication_status(), **scope(svc.config, cluster)}
    if regions is not None:
        out["primaries"] = [p for p in out["primaries"] if keeps(regions, p["source"])]
        out["failovers"] = [f for f in out["failovers"] if keeps(regions, f.get("source"))]
    return out


@router.get(
    "/replication/series", response_model=models.ReplicationSeries, responses=errors(404, 503)
)
def replication_series(
    svc: Service,
    source: Annotated[str, Query(max_length=200)],
    replica: Annotated[str, Query(max_length=200)],
    since: Time = None,
    until: Time = None,
    step: Step = None,
) -> dict[str, Any]:
    """One replica per epoch-aligned step (default range 1h): the most bytes behind, the
    least backlog headroom, the share of samples with the link up, and whether it was
    read-only all along (false: writable in some sample; null: never said)."""
    known = {(p.source, r.replica) for p in svc.latest_replication() for r in p.replicas}
    if known and (source, replica) not in known:
        names = ", ".join(f"{s}/{r}" for s, r in sorted(known))
        raise NotFound(f"unknown source/replica {source}/{replica} (known: {names})")
    span = TimeRange.parse(since, until, now_ns=time.time_ns(), default_since_s=3600)
    step_ns = span.step_ns(step, minimum_s=min(svc.settings.replication_interval, 60.0))
    rows = history.replica_series(
        svc.store, source=source, replica=replica, since_ns=span.since_ns, until_ns=span.until_ns
    )
    points: dict[int, dict[str, Any]] = {}
    for sampled_ns, state in rows:
        start = sampled_ns - sampled_ns % step_ns
        point = points.setdefault(
            start,
            {
                "t_ns": start,
                "bytes_behind_max": None,
                "headroom_fraction_min": None,
                "link_up_ratio": 0.0,
                "samples": 0,
                "read_only": None,
            },
        )
        point["samples"] += 1
        if state.read_only is not None:
            point["read_only"] = state.read_only and point["read_only"] is not False
        point["link_up_ratio"] += 1.0 if state.link_up else 0.0
        if state.bytes_behind is not None:
            point["bytes_behind_max"] = max(point["bytes_behind_max"] or 0, state.bytes_behind)
        if state.headroom_fraction is not None:
            low = point["headroom_fraction_min"]
            point["headroom_fraction_min"] = (
                state.headroom_fraction if low is None else min(low, state.headroom_fraction)
            )
    for point in points.values():
        point["link_up_ratio"] = round(point["link_up_ratio"] / point["samples"], 4)
    return {
        "since_ns": span.since_ns,
        "until_ns": span.until_ns,
        "source": source,
        "replica": replica,
        "step_s": step_ns / 1e9,
        "points": [points[k] for k in sorted(points)],
    }
