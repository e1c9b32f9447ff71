"""Probe writes, observation on replicas, and HDR percentiles of replication lag."""

from replag.probes.report import PairResult, ProbeReport, ProbeSample
from replag.probes.runner import run_probe, run_probe_all, save_report
from replag.probes.seed_method import run_seed_method

__all__ = [
    "PairResult",
    "ProbeReport",
    "ProbeSample",
    "run_probe",
    "run_probe_all",
    "run_seed_method",
    "save_report",
]
