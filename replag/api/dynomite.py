"""`GET /api/v1/dynomite`: the latest Dynomite /info figures of every configured node.

Read from the store (what the service's collector or `topology dynomite-stats`
saved) plus the service's last collection errors; the dashboard's Dynomite
panel draws this answer.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from replag.api import models
from replag.api.routes import Service

router = APIRouter(prefix="/api/v1")


@router.get("/dynomite", response_model=models.Dynomite)
def dynomite(svc: Service) -> dict[str, Any]:
    """Dynomite nodes from `settings.dynomite_stats_urls`.

    `nodes`: each node's latest sample (dc, rack, uptime, and every figure in
    `figures`: peer dropped/timed-out requests, cross-zone and cross-region
    latency, queues; latencies in µs, counters as Dynomite reports them).
    `errors`: nodes the last collection could not read. `dropped_writes`: nodes
    whose dropped peer requests grew between their last two samples (writes were
    dropped; replicas may have diverged: run repair).
    """
    return svc.dynomite_status()
