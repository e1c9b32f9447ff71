"""Replication state beside the probe: bytes behind, link state, resyncs, backlog headroom,
write rate, and what a failover would lose now (RPO).

`ReplicationSampler.sample()` reads a primary and its replicas close together;
`assess_failover()` ranks the replicas as failover candidates;
`assess_primaries()` is what `replag failover-check` runs once the primaries are found
(`replag.discovery.primaries`).
"""

from replag.replication.backlog import Backlog
from replag.replication.check import FailoverCheck, assess_primaries, recent_lag_p99_ms
from replag.replication.info import ReplicationInfo, parse_info
from replag.replication.rpo import FailoverAssessment, FailoverCandidate, assess_failover
from replag.replication.sampler import ReplicationSampler, SampleTarget, replication_targets
from replag.replication.state import PrimaryState, ReplicaState, ReplicationSnapshot

__all__ = [
    "Backlog",
    "FailoverAssessment",
    "FailoverCandidate",
    "FailoverCheck",
    "PrimaryState",
    "ReplicaState",
    "ReplicationInfo",
    "ReplicationSampler",
    "ReplicationSnapshot",
    "SampleTarget",
    "assess_failover",
    "assess_primaries",
    "parse_info",
    "recent_lag_p99_ms",
    "replication_targets",
]
