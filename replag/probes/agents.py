"""Which replicas of a probe run are watched by their region's agent, and opening those watches.

A region whose config names an `agent` has its replicas observed there, on
their local addresses, instead of across the WAN (`RegionWatch`). An agent that
cannot open the watch is noted and its region observed directly, as without an
agent, unless its certificate (or ours) was refused: that stops the run like a
Redis endpoint's TLS failure. Redis Cluster shards are observed directly (their replicas need
READONLY for polling, which agents do not send yet).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

from replag.errors import AgentError, AgentTlsError
from replag.probes.keys import ProbeKeys
from replag.probes.remote import RegionWatch
from replag.probes.setup import ProbeSetup
from replag.settings import Settings
from replag.topology import Endpoint

MAX_WATCH_S = 3600.0


async def open_region_watches(
    setup: ProbeSetup,
    targets: Sequence[tuple[str, Endpoint]],
    keys: ProbeKeys,
    settings: Settings,
    notes: list[str],
) -> list[RegionWatch]:
    """One open watch per agent region among `targets` ((region, replica) pairs)."""
    by_region: dict[str, list[Endpoint]] = {}
    for region_name, replica in targets:
        by_region.setdefault(region_name, []).append(replica)
    writing_s = settings.count / settings.rate if settings.rate else settings.count * 0.01
    spec = {
        "run_id": keys.run_id,
        "stem": base64.b64encode(keys.stem).decode(),
        "count": settings.count,
        "pattern": base64.b64encode(keys.pattern).decode(),
        "mode": settings.mode,
        "timeout_s": min(MAX_WATCH_S, writing_s + settings.timeout + 60.0),
    }
    watches: list[RegionWatch] = []
    for region_name, replicas in by_region.items():
        region = setup.topology.region(region_name)
        if region.agent is None:
            continue
        if region.slots:
            notes.append(
                f"{region_name}: a Redis Cluster shard is observed directly, not by its agent"
            )
            continue
        client = setup.agent_client(region_name, run_id=keys.run_id)
        assert client is not None
        watch = RegionWatch(
            client,
            region=region_name,
            replicas=replicas,
            spec=spec,
            stem=keys.stem,
            ours_bound_s=settings.clock_error_bound,
        )
        try:
            await watch.open()
        except AgentTlsError:
            # A certificate refused is a configuration mistake, as on a Redis endpoint:
            # the run stops (exit 2), it does not fall back to watching across the WAN.
            for opened in (*watches, watch):
                await opened.close()
                await opened.client.close()
            raise
        except AgentError as exc:
            notes.append(f"agent of {region_name} could not watch ({exc}); observed directly")
            await client.close()
            continue
        watches.append(watch)
    return watches
