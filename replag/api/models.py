"""Response models of the JSON API: what every 200 holds, as the OpenAPI document says.

Each object allows fields beyond those declared (a newer server may add some; a client
keeps them as additional properties), and declares the ones a client relies on with
their types. The lag routes answer pre-serialised bytes (their answers are cached), so
for them the model documents the answer; tests hold real answers to it (schemathesis's
response-conformance check, and a client generated from /openapi.json).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# --- health, topology ---------------------------------------------------------------


class Scoped(Open):
    cluster: str | None = Field(
        default=None, description="the `cluster` filter applied (None: every cluster)"
    )
    clusters: list[str] = Field(
        default=[], description="every cluster the configuration's regions name"
    )


class HealthProblem(Open):
    kind: str = Field(
        description="probe_error, stale, unreachable, not_replicating, loss, alerts, store, "
        "replication (the latest sample: a replica not replicating, a primary unread), "
        "writable (replica-read-only no), divergence (the latest check or repair run), "
        "not_compared (the group's latest run left keys it could not compare: module types "
        "without a digest)"
    )
    severity: str
    message: str
    source: str | None = None
    target: str | None = None
    replica: str | None = None
    group: str | None = Field(
        default=None, description="divergence, not_compared: the replica group"
    )


class ReplicaHealth(Open):
    source: str
    target: str
    replica: str
    state: str = Field(description="ok, lossy or not_replicating in the source's latest run")
    run_end_ns: int
    sent: int
    lost: int
    last_seen_ns: int | None = None


class PairHealth(Open):
    source: str
    target: str
    replica: None = None
    state: str = Field(
        description="ok, lossy or not_replicating in the source's latest run: the worst of "
        "its replicas'"
    )
    run_end_ns: int
    sent: int
    lost: int
    last_seen_ns: int | None = None
    replicas: list[ReplicaHealth] = Field(
        default=[], description="each replica the source's latest run observed"
    )
    recovered_ns: int | None = Field(
        default=None,
        description="replicating again: the end of the first run that saw probes after the "
        "last run that saw none (null: not down before, or down now)",
    )


class ProbeHealth(Open):
    source: str
    last_attempt_ns: int
    last_success_ns: int | None = None
    last_run_id: str | None = None
    unreachable: list[dict[str, str]] = []
    error: str | None = None


class Health(Scoped):
    version: str
    status: str = Field(description="ok, degraded or failing")
    problems: list[HealthProblem]
    pairs: list[PairHealth]
    started_ns: int
    uptime_s: float
    probe_interval_s: float
    check_interval_s: float
    auto_repair: bool
    probes: dict[str, ProbeHealth]
    jobs_running: int


class EndpointOut(Open):
    name: str
    url: str = Field(description="passwords shown as ***")
    kind: str
    region: str | None = None
    rack: str | None = None


class RegionOut(Open):
    name: str
    write: EndpointOut | None = None
    replicas: list[EndpointOut]


class GroupOut(Open):
    name: str
    members: list[EndpointOut]


class TopologyOut(Open):
    regions: list[RegionOut]
    groups: list[GroupOut]
    settings: dict[str, Any] = Field(description="every setting, secrets masked")


# --- repairs --------------------------------------------------------------------------


class Job(Open):
    job_id: str
    action: str = Field(description="check or repair")
    group: str | None = None
    state: str
    started_ns: int
    finished_ns: int | None = None
    run_id: str | None = None
    divergent: int | None = None
    not_compared: int | None = Field(
        None, description="keys whose values could not be compared: the run is not clean"
    )
    error: str | None = None


class RepairRun(Open):
    run_id: str
    kind: str = Field(description="check, repair or rebuild")
    status: str
    started: float | None = None
    finished: float | None = None
    params: dict[str, Any] | None = None
    error: str | None = None
    report: dict[str, Any] | None = Field(default=None, description="the run's report")


class RepairList(Open):
    total: int
    offset: int
    runs: list[RepairRun]
    jobs: list[Job]


class RepairRunOrJob(Open):
    """A run from the store, or `{"job": …}` for a job this service is running."""

    job: Job | None = None
    run_id: str | None = None
    kind: str | None = None
    status: str | None = None
    report: dict[str, Any] | None = None


# --- alerts ---------------------------------------------------------------------------


class ActiveAlert(Open):
    fingerprint: str
    rule: str
    labels: dict[str, str]
    status: str = Field(description="pending, firing or nodata")
    value: float | None = None
    summary: str
    active_since_ns: int | None = None
    fired_ns: int | None = None
    nodata_since_ns: int | None = None
    last_notified_ns: int | None = None


class AlertEvent(Open):
    fingerprint: str
    rule: str
    labels: dict[str, str]
    status: str
    at_ns: int
    value: float | None = None
    summary: str


class SinkStatus(Open):
    name: str
    kind: str
    last_status: str | None = None
    delivered: int | None = None
    failed: int | None = None


class AlertRule(Open):
    name: str
    kind: str
    severity: str | None = None


class Alerts(Scoped):
    active: list[ActiveAlert]
    history: list[AlertEvent]
    sinks: list[SinkStatus]
    rules: list[AlertRule]


# --- dynomite -------------------------------------------------------------------------


class DynomiteNode(Open):
    node: str
    dc: str | None = None
    rack: str | None = None
    sampled_ns: int
    uptime_s: float | None = None
    backends: list[str] = []


class NodeError(Open):
    node: str
    error: str


class DynomiteFigure(Open):
    name: str
    help: str
    counter: bool


class Dynomite(Open):
    configured: int
    interval_s: float
    collected_ns: int | None = None
    window_s: float
    nodes: list[DynomiteNode]
    errors: list[NodeError]
    dropped_writes: list[dict[str, Any]]
    figures: list[DynomiteFigure]


# --- replication ----------------------------------------------------------------------


class ReplicaReplication(Open):
    replica: str
    region: str | None = None
    status: str = Field(description="ok, link-down, syncing, unreachable, not-replicating")
    link_up: bool | None = None
    bytes_behind: int | None = None
    bytes_uncertainty: int | None = None
    backlog_headroom: int | None = None
    headroom_fraction: float | None = None
    headroom_colour: str | None = None
    loading: bool | None = Field(
        default=None, description="loading its dataset (status syncing): reads refused"
    )
    error: str | None = None


class PrimaryReplication(Open):
    source: str
    primary: str
    offset: int | None = None
    replicas: list[ReplicaReplication]
    error: str | None = None
    sampled_ns: int | None = None
    age_s: float | None = None
    failover: dict[str, Any] | None = Field(default=None, description="RPO per replica")


class Replication(Scoped):
    interval_s: float
    primaries: list[PrimaryReplication]
    failovers: list[dict[str, Any]]


class ReplicationPoint(Open):
    t_ns: int
    bytes_behind_max: int | None = None
    headroom_fraction_min: float | None = None
    link_up_ratio: float
    samples: int
    # False: writable (replica-read-only no) in some sample of the step; None: not known.
    read_only: bool | None = None


class ReplicationSeries(Open):
    since_ns: int
    until_ns: int
    source: str
    replica: str
    step_s: float
    points: list[ReplicationPoint]


# --- lag ------------------------------------------------------------------------------


class Percentiles(Open):
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    p999: float | None = None
    max: float | None = None


class LagSummary(Open):
    source: str
    target: str
    replica: str | None = None
    sent: int
    seen: int
    lost: int
    loss_ratio: float
    lag_ms: Percentiles
    uncertainty_ms: dict[str, float | None]
    out_of_range: int


class LagPair(LagSummary):
    replicas: list[LagSummary] = Field(
        default=[], description="the same figures per replica (the pair is their roll-up)"
    )


class Ranged(Open):
    since_ns: int
    until_ns: int
    fresh: bool = Field(description="false: a previous answer, while a new one is computed")


class Lag(Ranged, Scoped):
    pairs: list[LagPair]


class Bands(Open):
    warning: float
    critical: float


class MatrixReplica(Open):
    source: str
    target: str
    replica: str
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    sent: int
    seen: int
    lost: int
    loss_ratio: float
    colour: str = Field(description="green, amber or red")
    lag_ms: Bands
    loss: Bands


class MatrixCell(Open):
    source: str
    target: str
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    sent: int
    seen: int
    lost: int
    loss_ratio: float
    colour: str = Field(description="green, amber or red; never better than its worst replica")
    lag_ms: Bands
    loss: Bands
    replicas: list[MatrixReplica] = Field(default=[], description="each replica's own cell")


class Matrix(Ranged, Scoped):
    replication: list[dict[str, Any]]
    regions: list[str]
    cells: list[MatrixCell]
    thresholds_ms: Bands
    loss_thresholds: Bands


class SeriesPoint(Open):
    t_ns: int
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    sent: int
    seen: int
    lost: int


class Series(Ranged):
    source: str
    target: str
    replica: str | None = Field(default=None, description="the replica's series; None: the pair's")
    step_s: float
    points: list[SeriesPoint]
