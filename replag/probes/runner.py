"""One probe run: write timestamped keys in a source region, watch them land on every replica.

Every time here is `time.monotonic_ns()` of this one process, so no clock
offset enters a lag figure; a sample's lag is (estimated replica apply moment)
minus (midpoint of the write's send and acknowledgement, stamped at the
socket), and its uncertainty is the half-width of the replica bracket plus half
the write round trip. Unreachable replicas are reported in the result, never
raised; only a source whose write endpoint fails raises (exit 2 at the CLI).

Here: resolving the source (a Cluster shard's or Sentinel's current primary), the
run's report and its verdict. The run's parts: `measure` (connect, watch, wait),
`writes` (the writer and its keys), `samples` (arrivals into lags), `stored`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from replag.config import Config
from replag.errors import (
    ConfigError,
    DiscoveryError,
    EndpointError,
    MisconfiguredError,
    ReplagError,
    UsageError,
)
from replag.probes.keys import ProbeKeys
from replag.probes.measure import ProbeRun
from replag.probes.progress import ProbeProgress, ProgressCallback
from replag.probes.report import ProbeReport, combine_reports
from replag.probes.setup import ProbeSetup
from replag.probes.stored import save_report
from replag.probes.targets import ReplicaTarget
from replag.probes.writes import open_writer_or_fallback
from replag.replication.alongside import ProbeReplication
from replag.replication.sampler import ReplicationSampler
from replag.settings import Settings
from replag.store import Store
from replag.topology import Endpoint, Region, Topology

if TYPE_CHECKING:
    from replag.discovery.cluster_follow import ShardNow

__all__ = [
    "ProbeProgress",
    "ProbeSetup",
    "ProgressCallback",
    "probe",
    "run_probe",
    "run_probe_all",
    "save_report",
]

log = logging.getLogger(__name__)


async def run_probe(
    config: Config,
    *,
    source: str | None = None,
    count: int | None = None,
    rate: float | None = None,
    mode: str | None = None,
    timeout_s: float | None = None,
    store: Store | None = None,
    sampler: ReplicationSampler | None = None,
    progress: ProgressCallback | None = None,
    fence: Callable[[], None] | None = None,
) -> ProbeReport:
    """Probe from `source` (default: the first region with a write endpoint) to every replica.

    `progress`, when given, is called as keys are written and as they arrive. `fence`
    (the service's lease on this source) is called before every write to Redis and
    before the results are stored, and raises (LeaseLost) once the lease is gone.
    """
    setup = ProbeSetup.of(config, count=count, rate=rate, mode=mode, timeout_s=timeout_s)
    return await probe(
        setup, source=source, store=store, sampler=sampler, progress=progress, fence=fence
    )


async def probe(
    setup: ProbeSetup,
    *,
    source: str | None = None,
    store: Store | None = None,
    sampler: ReplicationSampler | None = None,
    progress: ProgressCallback | None = None,
    fence: Callable[[], None] | None = None,
) -> ProbeReport:
    """`run_probe` from what it read of the config."""
    topology, settings = setup.topology, setup.settings
    region = topology.region(source) if source else topology.default_source()
    if region.write is None:
        raise UsageError(f"region {region.name!r} has no write endpoint to probe from")
    # A Redis Cluster shard: where its primary is and which slots it holds now.
    shard = await _follow_shard(topology, region, settings, store)
    region = shard.region if shard is not None else region
    # Through Sentinel where the region has one: the primary may have moved.
    replication = await ProbeReplication.open(
        topology, region, settings=settings, store=store, sampler=sampler
    )
    report = _new_report(region, replication.write_endpoint, settings)
    keys = ProbeKeys(
        prefix=settings.prefix, run_id=report.run_id, source=region.name, slots=region.slots
    )
    if keys.longest_value(settings.count) > settings.max_probe_value_bytes:
        await replication.close()
        raise ConfigError(
            f"region {region.name!r}: its probe values hold {keys.longest_value(settings.count)}"
            f" bytes, over max_probe_value_bytes = {settings.max_probe_value_bytes} (a "
            "shorter region name, or a larger setting)",
            where="settings.max_probe_value_bytes",
        )
    if shard is not None:
        report.notes += shard.notes
        replication.event = replication.event or shard.event
    report.notes += replication.notes
    try:
        if replication.write_endpoint.kind == "dynomite":
            await _cluster_consistency(settings, report)
        writer = await open_writer_or_fallback(
            replication.write_endpoint, region.write_fallbacks, settings, report
        )
    except BaseException:
        await replication.close()
        raise
    run = ProbeRun(
        settings=settings,
        keys=keys,
        report=report,
        replication=replication,
        writer=writer,
        targets=_targets(topology, region, writer.endpoint, report),
        setup=setup,
        progress=progress,
        fence=fence,
    )
    try:
        await run.measure()
    finally:
        await run.close()
    _finish(run)
    if store is not None:
        if fence is not None:
            fence()
        save_report(store, report)
        replication.save(store, region)
    return report


async def _follow_shard(
    topology: Topology, region: Region, settings: Settings, store: Store | None
) -> ShardNow | None:
    """The shard as the cluster has it now, for a Redis Cluster shard's region."""
    if not (region.slots or region.shard):
        return None
    from replag.discovery.cluster_follow import follow_shard

    return await follow_shard(topology, region, timeout_s=settings.connect_timeout, store=store)


def _new_report(region: Region, write_ep: Endpoint, settings: Settings) -> ProbeReport:
    return ProbeReport(
        run_id=uuid.uuid4().hex[:12],
        source=region.name,
        mode=settings.mode,
        started_ns=time.time_ns(),
        write_endpoint=write_ep.url(),
        consistency=(settings.dynomite_consistency or "cluster default")
        if write_ep.kind == "dynomite"
        else None,
    )


def _targets(
    topology: Topology, region: Region, write_ep: Endpoint, report: ProbeReport
) -> list[ReplicaTarget]:
    """Every replica a write in `region` should reach, but the write endpoint itself."""
    servers, skipped = topology.reached_from(region, write_ep)
    for rep in skipped:
        # Probe keys are written there directly: it holds them at once, which
        # says nothing about replication. Say so rather than drop it silently.
        report.notes.append(
            f"replica {rep.name} ({rep.region or region.name}) is the write endpoint's own "
            f"address ({rep.host}:{rep.port}/{rep.db}): not observed"
        )
    return [ReplicaTarget(region=r.name, replica=rep, cluster=bool(r.slots)) for r, rep in servers]


def _finish(run: ProbeRun) -> None:
    """Label, judge and date the measured report."""
    report, settings, replication = run.report, run.settings, run.replication
    report.finished_ns = time.time_ns()
    if run.by_rack:
        for pair in report.pairs:
            pair.consistency = settings.dynomite_consistency
    replication.finish(
        {p.replica: p99 for p in report.pairs if (p99 := p.summary.lag_ms["p99"]) is not None}
    )
    report.replication = replication.snapshot
    _exclude_unsettled(report, replication.syncing(), replication.loading(), run.loading())
    if replication.event is not None:
        report.failovers.append(replication.event)
    report.evaluate(max_p99_s=settings.max_p99, max_loss=settings.max_loss)


def _exclude_unsettled(
    report: ProbeReport,
    syncing: tuple[set[str], set[str]],
    loading: set[str],
    refused_reads: set[str],
) -> None:
    """A replica in a resync or loading its dataset during the run: its samples time the
    sync or the load (or are lost to it), so they are flagged and kept out of the
    figures, and a note says why; it is not unreachable. Syncing when the run started:
    every sample waited for the sync. Only when it ended: the sync began during the run,
    which matters where it cost probes. Answering LOADING to the probe (`refused_reads`)
    at any time: its reads waited for the load."""
    at_start, at_end = syncing
    for pair in report.pairs:
        name = pair.replica
        during = name in refused_reads or name in at_start or (name in at_end and pair.lost > 0)
        if not (during and pair.sent):
            continue
        count = pair.sent
        if name in refused_reads or name in loading:
            pair.exclude("loading")
            what = (
                "loading its dataset during the run (LOADING: a resync's snapshot after "
                "its transfer, or its own file after a restart)"
            )
        else:
            pair.exclude("syncing")
            what = "syncing with its primary during the run (a full or initial resync)"
        report.samples = [s for s in report.samples if s.replica != name]
        report.notes.append(
            f"{pair.label}: the replica was {what}: its {count} samples are kept out of the "
            "percentiles and the loss ratio"
        )


async def run_probe_all(
    config: Config,
    *,
    count: int | None = None,
    rate: float | None = None,
    mode: str | None = None,
    timeout_s: float | None = None,
    store: Store | None = None,
    progress: ProgressCallback | None = None,
) -> ProbeReport:
    """Probe from every region that has a write endpoint (every shard of a Redis Cluster).

    A source that cannot be probed (its primary down, its shard not found) is reported
    in the combined report as unreachable, and the other sources are probed all the
    same; only when none can be, its error is raised."""
    sources = [r for r in config.topology.regions if r.write is not None]
    if not sources:
        raise UsageError("no region has a write endpoint to probe from")
    reports, errors = [], []
    for region in sources:
        try:
            report = await run_probe(
                config,
                source=region.name,
                count=count,
                rate=rate,
                mode=mode,
                timeout_s=timeout_s,
                store=store,
                progress=progress,
            )
        except MisconfiguredError:
            raise  # a configuration error (TLS, not Redis): exit 2 whatever the others do
        except (EndpointError, DiscoveryError) as exc:
            errors.append(exc)
            log.warning("probe from %s failed: %s", region.name, exc)
            report = _failed_report(region, exc)
        reports.append(report)
    if len(errors) == len(sources):
        raise errors[0]
    return combine_reports(reports)


def _failed_report(region: Region, exc: ReplagError) -> ProbeReport:
    """What a source that could not be probed adds to a combined report."""
    assert region.write is not None
    now = time.time_ns()
    report = ProbeReport(run_id="-", source=region.name, mode="-", started_ns=now, finished_ns=now)
    report.unreachable.append(
        {"replica": region.write.name, "region": region.name, "error": f"probe failed: {exc}"}
    )
    report.notes.append(f"not probed: {exc}")
    return report


async def _cluster_consistency(settings: Settings, report: ProbeReport) -> None:
    """Ask the Dynomite stats ports which read/write consistency the cluster runs with."""
    from replag.discovery.dynomite import fetch_consistency

    for url in settings.dynomite_stats_urls:
        try:
            found = await fetch_consistency(url, timeout_s=settings.connect_timeout)
        except ReplagError as exc:
            report.notes.append(f"cluster consistency unknown from {url}: {exc.message}")
            continue
        if found is not None:
            report.cluster_consistency = {"read": found.read, "write": found.write, "from": url}
            if not settings.dynomite_consistency:
                report.consistency = f"{found.write} (cluster)"
            return
