"""The `cluster` filter of the API: which regions a cluster covers, checked once.

Where one service watches many clusters each region names its cluster
(`Region.cluster`); `?cluster=NAME` keeps that cluster's regions (and the pairs,
replicas, groups and primaries whose source is one of them). An unknown name is a
404 naming the known ones. A configuration without clusters has none to filter by.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query

from replag.config import Config
from replag.errors import NotFound
from replag.topology import Topology

Cluster = Annotated[
    str | None,
    Query(
        max_length=200,
        description="a cluster's name (regions name their cluster): only its regions",
    ),
]


def cluster_names(topology: Topology) -> list[str]:
    return sorted({r.cluster for r in topology.regions if r.cluster})


def cluster_regions(config: Config, cluster: str | None) -> frozenset[str] | None:
    """The regions of `cluster` (None: no filter); NotFound for a cluster no region names."""
    if cluster is None:
        return None
    regions = frozenset(r.name for r in config.topology.regions if r.cluster == cluster)
    if not regions:
        known = cluster_names(config.topology)
        raise NotFound(
            f"cluster: unknown cluster {cluster!r} (known: {', '.join(known) or 'none'})"
        )
    return regions


def group_clusters(topology: Topology) -> dict[str, str | None]:
    """Each replica group's cluster: its members' regions' (None when they name none)."""
    of_region = {r.name: r.cluster for r in topology.regions}
    out: dict[str, str | None] = {}
    for group in topology.groups:
        names = {of_region.get(m.region or "") for m in group.members} - {None}
        out[group.name] = next(iter(names)) if len(names) == 1 else None
    return out


def scope(config: Config, cluster: str | None) -> dict[str, Any]:
    """The members every filtered answer carries: the filter and the clusters known."""
    return {"cluster": cluster, "clusters": cluster_names(config.topology)}


def keeps(regions: frozenset[str] | None, source: object) -> bool:
    """Whether an item of `source` (a region name; None: not of any region) stays."""
    return regions is None or source is None or source in regions


def alert_kept(config: Config, cluster: str | None, labels: dict[str, Any]) -> bool:
    """An alert stays when its `source` is one of the cluster's regions, or its `group`
    one of its groups (alerts of neither, a store's, stay)."""
    regions = cluster_regions(config, cluster)
    if regions is None:
        return True
    if "source" in labels:
        return labels["source"] in regions
    if "group" in labels:
        return group_clusters(config.topology).get(labels["group"]) == cluster
    return True
