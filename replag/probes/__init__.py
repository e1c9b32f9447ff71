"""Probe writes, observation on replicas, and HDR percentiles of replication lag.

The public names are loaded on first use, so that `replag.store` can import
`replag.histogram` without pulling in the runner (which imports the store).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replag.probes.report import PairResult, ProbeReport, ProbeSample
    from replag.probes.runner import run_probe, run_probe_all, save_report
    from replag.probes.seed_method import run_seed_method

_WHERE = {
    "PairResult": "replag.probes.report",
    "ProbeReport": "replag.probes.report",
    "ProbeSample": "replag.probes.report",
    "run_probe": "replag.probes.runner",
    "run_probe_all": "replag.probes.runner",
    "save_report": "replag.probes.runner",
    "run_seed_method": "replag.probes.seed_method",
}

__all__ = [
    "PairResult",
    "ProbeReport",
    "ProbeSample",
    "run_probe",
    "run_probe_all",
    "run_seed_method",
    "save_report",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(name)
