"""What replag exports and what its dashboard reads, for the tests that check they agree."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from replag.agent.metrics import AgentMetrics
from replag.metrics import ServiceMetrics


def exported_metrics() -> set[str]:
    """The sample names `replag serve` and `replag agent` export (every family, by its
    type); an agent without trees still names every family."""
    names = set()
    agent = AgentMetrics(SimpleNamespace(trees={}, parts=[]))  # type: ignore[arg-type]
    families = [*ServiceMetrics().registry.collect(), *agent.registry.collect()]
    for family in families:
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
        }.get(family.type, ("",))
        names |= {family.name + s for s in suffixes}
    return names


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too (the rows themselves aside)."""
    out = []
    for p in dashboard["panels"]:
        out += p.get("panels", []) if p["type"] == "row" else [p]
    return out
