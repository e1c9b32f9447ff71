"""The versioned JSON API (`/api/v1/…`) apart from lag: health, topology, repairs, alerts.

A thin layer over the service object. Read endpoints are plain functions, so
FastAPI runs them in its thread pool, off the event loop the probes time their
observations on. Anything that changes data needs a bearer token with the
scope it takes (`replag.api.auth`), and is logged and stored under the token's
name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from replag import __version__
from replag.api import models
from replag.api.auth import Caller, caller_with, log_change
from replag.api.clusters import Cluster, alert_kept, cluster_regions, keeps, scope
from replag.api.errors import errors
from replag.errors import StoreUnwritable
from replag.repair import count_runs, get_run, list_runs
from replag.service import ReplagService

router = APIRouter(prefix="/api/v1")


async def service(request: Request) -> ReplagService:
    svc: ReplagService = request.app.state.service
    return svc


Service = Annotated[ReplagService, Depends(service)]


@router.get("/health", response_model=models.Health, responses=errors(404))
def health(svc: Service, cluster: Cluster = None) -> dict[str, Any]:
    """Liveness and the last probe outcome of every source; `cluster` keeps the problems,
    pairs and probes of that cluster's regions (and the problems of no region)."""
    config = svc.config
    regions = cluster_regions(config, cluster)
    out = {"version": __version__, **svc.health(), **scope(config, cluster)}
    if regions is not None:
        out["problems"] = [p for p in out["problems"] if keeps(regions, p.get("source"))]
        out["pairs"] = [p for p in out["pairs"] if keeps(regions, p["source"])]
        out["probes"] = {k: v for k, v in out["probes"].items() if k in regions}
        if any(p["severity"] == "critical" for p in out["problems"]):
            out["status"] = "failing"
        else:
            out["status"] = "degraded" if out["problems"] else "ok"
    return out


@router.get("/topology", response_model=models.TopologyOut)
def topology(svc: Service) -> dict[str, Any]:
    """Regions, replicas and groups; passwords and tokens are never included."""
    return {**svc.config.topology.to_dict(), "settings": svc.settings.public()}


@router.get("/repairs", response_model=models.RepairList, responses=errors(503))
def repairs(
    svc: Service,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> dict[str, Any]:
    """Repair checks and runs from the store, newest first (`limit` from `offset`; `total`
    counts them all), and the jobs this service is running."""
    runs = list_runs(svc.store, limit=limit, offset=offset)
    jobs = sorted(svc.jobs.values(), key=lambda j: j.started_ns, reverse=True)[:limit]
    return {
        "total": count_runs(svc.store),
        "offset": offset,
        "runs": runs,
        "jobs": [j.to_dict() for j in jobs],
    }


@router.get(
    "/repairs/{run_id}",
    response_model=models.RepairRunOrJob,
    response_model_exclude_unset=True,
    responses=errors(404, 503),
)
def repair_run(svc: Service, run_id: Annotated[str, Path(max_length=128)]) -> dict[str, Any]:
    """One repair run by its run id (or a service job by its job id)."""
    if run_id in svc.jobs:
        return {"job": svc.jobs[run_id].to_dict()}
    run = get_run(svc.store, run_id)
    if run is None:
        raise HTTPException(404, f"no repair run {run_id!r}")
    return dict(run)


class RepairRequest(BaseModel):
    # Strict: a data-changing request says exactly what it means ("allow_deletes": "N"
    # is refused, not read as false).
    model_config = ConfigDict(extra="forbid", strict=True)

    action: Literal["check", "repair"] = "check"
    group: str | None = Field(default=None, max_length=200, description="default: every group")
    policy: str | None = Field(
        default=None,
        max_length=200,
        pattern=r"^(primary|majority|quorum|source:.+|newest:.+)$",
        description="primary, majority, quorum, source:REPLICA_OR_REGION or newest:FIELD "
        "(default: each group's kind's: primary for replication groups, majority for "
        "Dynomite, quorum for independent peers)",
    )
    dry_run: bool = False
    allow_deletes: bool = False
    ttls: Literal["compare", "ignore"] | None = Field(
        default=None, description="compare or ignore expiries (default: settings.repair_ttls)"
    )


@router.post(
    "/repairs",
    status_code=202,
    response_model=models.Job,
    responses=errors(400, 401, 403, 404, 409),
)
async def start_repair(
    svc: Service,
    body: RepairRequest,
    request: Request,
    caller: Annotated[Caller, Depends(caller_with("check"))],
) -> dict[str, Any]:
    """Start a check (token scope check) or a repair (scope repair) in the background;
    poll `/repairs/{job_id}` for it. The job and its run record the token's name.

    An unknown group or a policy the groups cannot use (`source:` naming no member)
    is refused here with a 400, not left to fail in the background.
    """
    caller.require(body.action, request)
    options: dict[str, Any] = {"ttls": body.ttls}
    if body.action == "repair":
        options |= {
            "policy": body.policy,
            "dry_run": body.dry_run,
            "allow_deletes": body.allow_deletes,
        }
    job = svc.start_job(body.action, body.group, started_by=caller.started_by, **options)
    log_change(
        caller,
        f"{body.action} of {body.group or 'every group'} started",
        job=job.id,
        policy=options.get("policy"),
        dry_run=options.get("dry_run"),
        allow_deletes=options.get("allow_deletes"),
    )
    return job.to_dict()


@router.get("/alerts", response_model=models.Alerts, responses=errors(404))
def alerts(
    svc: Service,
    history: Annotated[int, Query(ge=0, le=1000)] = 50,
    cluster: Cluster = None,
) -> dict[str, Any]:
    """Active alerts, recent state changes, and each sink's last delivery status; `cluster`
    keeps the alerts whose source region or group is that cluster's. While the store is
    away: the active alerts as evaluated meanwhile, the state changes as last read."""
    config = svc.config
    cluster_regions(config, cluster)  # 404 on an unknown cluster
    try:
        changes = svc.alert_book.history(limit=history)
    except StoreUnwritable:
        changes = []  # the store is away and this history was never read: none to show
    return {
        "active": [a for a in svc.alert_book.active() if alert_kept(config, cluster, a["labels"])],
        "history": [a for a in changes if alert_kept(config, cluster, a["labels"])],
        "sinks": svc.sender.statuses(),
        "rules": [r.to_dict() for r in config.alerts.rules],
        **scope(config, cluster),
    }
