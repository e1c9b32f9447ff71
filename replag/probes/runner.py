"""One probe run: write timestamped keys in a source region, watch them land on every replica.

Every time here is `time.monotonic_ns()` of this one process, so no clock
offset enters a lag figure; a sample's lag is (estimated replica apply moment)
minus (midpoint of the write's send and acknowledgement, stamped at the
socket), and its uncertainty is the half-width of the replica bracket plus half
the write round trip. Unreachable replicas are reported in the result, never
raised; only a source whose write endpoint fails raises (exit 2 at the CLI).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import hiredis

from replag.clock import estimate_offset
from replag.config import Config
from replag.errors import (
    DiscoveryError,
    EndpointError,
    MisconfiguredError,
    PermissionRefused,
    ReplagError,
    TlsError,
    UnreachableError,
    UsageError,
)
from replag.permissions import require_on
from replag.probes.keys import ProbeKeys
from replag.probes.observers import Arrival, Observer, open_observer
from replag.probes.report import PairResult, ProbeReport, ProbeSample, combine_reports
from replag.probes.targets import unit_key, unit_label
from replag.replication.alongside import ProbeReplication
from replag.replication.sampler import ReplicationSampler
from replag.resp import RespConnection, pack
from replag.settings import Settings
from replag.store import LagWindow, Store
from replag.topology import Endpoint, Region

if TYPE_CHECKING:
    from replag.discovery.cluster_follow import ShardNow
    from replag.probes.remote import RegionWatch

log = logging.getLogger(__name__)
_CLEANUP_BATCH = 500


@dataclass(frozen=True, kw_only=True)
class ProbeProgress:
    """Where a run is: `phase` "writing" (done = keys written) or "waiting" (done = arrivals
    seen, over every replica or Dynomite rack), out of `total`."""

    source: str
    phase: str
    done: int
    total: int


ProgressCallback = Callable[[ProbeProgress], None]


@dataclass
class _Target:
    region: str
    replica: Endpoint
    cluster: bool = False
    conn: RespConnection | None = None
    observer: Observer | None = None
    error: str | None = None
    # A certificate or an ACL permission refused: a configuration error, not an outage:
    # the run stops (exit 2).
    fatal: TlsError | PermissionRefused | None = None


@dataclass(kw_only=True)
class _ProbeRun:
    """One run's open connections and what it measures; `close()` ends them all."""

    settings: Settings
    keys: ProbeKeys
    report: ProbeReport
    replication: ProbeReplication
    writer: RespConnection
    targets: list[_Target]
    config: Config
    progress: ProgressCallback | None = None
    fence: Callable[[], None] | None = None  # raises once the service's lease is lost
    # Regions whose agent watches their replicas (lag through agents), and the clock
    # round trips to those agents that run while the keys are written.
    watches: list[RegionWatch] = field(default_factory=list)
    clock_rounds: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def by_rack(self) -> bool:
        """Through Dynomite, a rack (not each backend) is what receives a write or not."""
        return self.writer.endpoint.kind == "dynomite"

    async def measure(self) -> None:
        """Connect to every replica, write the keys, wait for them, fill the report."""
        settings, report, writer, progress = self.settings, self.report, self.writer, self.progress
        remote = await self._open_watches()
        await asyncio.gather(
            *(
                _open_target(t, self.keys, settings, report)
                for t in self.targets
                if t.observer is None
            )
        )
        for target in self.targets:
            if target.fatal is not None:
                raise target.fatal
        if writer.endpoint.kind == "redis":
            try:
                offset = await estimate_offset(lambda: _time(writer), endpoint=writer.endpoint.name)
                report.clock.insert(0, offset)
            except ReplagError as exc:
                report.notes.append(_no_clock(writer.endpoint.name, exc))
        await self.replication.sample_start()
        live = [t.observer for t in self.targets if t.observer is not None]
        for obs in live:
            await obs.start()
        # The agents' clocks are compared with ours while the keys are written.
        self.clock_rounds += [asyncio.create_task(w.sample_clock()) for w in self.watches]
        writes = await _write_keys(
            writer, self.keys, settings, live, report, progress, fence=self.fence
        )
        units = [
            [t.observer for t in unit if t.observer is not None and t.replica.name not in remote]
            for unit in _observation_units(self.targets, by_rack=self.by_rack)
        ]
        await asyncio.gather(
            _wait_for_arrivals(
                [u for u in units if u],
                writes,
                settings.timeout,
                None if progress is None else _reporter(progress, report.source),
            ),
            *(_finish_watch(w, writes, settings.timeout, self.clock_rounds) for w in self.watches),
        )
        for obs in live:
            await obs.stop()
        await self.replication.sample_end()
        _collect(report, self.targets, writes, by_rack=self.by_rack)
        if self.fence is not None:
            self.fence()
        await _cleanup(writer, [self.keys.key(seq) for seq in writes], report)

    async def _open_watches(self) -> set[str]:
        """Have the agents of agent regions watch their replicas; the replicas' names."""
        if not any(self.config.topology.region(t.region).agent for t in self.targets):
            return set()
        # Only runs with agents load their HTTP client (and what it brings: aiohttp, numpy).
        from replag.probes.agents import open_region_watches

        self.watches = await open_region_watches(
            self.config,
            [(t.region, t.replica) for t in self.targets],
            self.keys,
            self.settings,
            self.report.notes,
        )
        remote = {name: obs for w in self.watches for name, obs in w.observers.items()}
        for t in self.targets:
            t.observer = remote.get(t.replica.name)
        return set(remote)

    async def close(self) -> None:
        """Also on error or cancellation: no subscription, poll task or socket outlives a run
        (the service runs one per source every probe interval)."""
        await self.writer.close()
        await self.replication.close()
        for task in self.clock_rounds:
            task.cancel()
        await asyncio.gather(*self.clock_rounds, return_exceptions=True)
        for w in self.watches:
            await w.close()
            await w.client.close()
            self.report.agents.append(w.to_dict())
        for t in self.targets:
            if t.observer is not None:
                await t.observer.stop()
            if t.conn is not None:
                await t.conn.close()


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
    settings = config.settings.replace(count=count, rate=rate, mode=mode, timeout=timeout_s)
    region = config.topology.region(source) if source else config.topology.default_source()
    if region.write is None:
        raise UsageError(f"region {region.name!r} has no write endpoint to probe from")
    # A Redis Cluster shard: where its primary is and which slots it holds now.
    shard = await _follow_shard(config, region, settings, store)
    region = shard.region if shard is not None else region
    # Through Sentinel where the region has one: the primary may have moved.
    replication = await ProbeReplication.open(
        config, region, settings=settings, store=store, sampler=sampler
    )
    report = _new_report(region, replication.write_endpoint, settings)
    if shard is not None:
        report.notes += shard.notes
        replication.event = replication.event or shard.event
    report.notes += replication.notes
    try:
        if replication.write_endpoint.kind == "dynomite":
            await _cluster_consistency(settings, report)
        writer = await _open_writer_or_fallback(
            replication.write_endpoint, region.write_fallbacks, settings, report
        )
    except BaseException:
        await replication.close()
        raise
    run = _ProbeRun(
        settings=settings,
        keys=ProbeKeys(
            prefix=settings.prefix, run_id=report.run_id, source=region.name, slots=region.slots
        ),
        report=report,
        replication=replication,
        writer=writer,
        targets=_targets(config, region, writer.endpoint, report),
        config=config,
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
    config: Config, region: Region, settings: Settings, store: Store | None
) -> ShardNow | None:
    """The shard as the cluster has it now, for a Redis Cluster shard's region."""
    if not (region.slots or region.shard):
        return None
    from replag.discovery.cluster_follow import follow_shard

    return await follow_shard(
        config.topology, region, timeout_s=settings.connect_timeout, store=store
    )


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
    config: Config, region: Region, write_ep: Endpoint, report: ProbeReport
) -> list[_Target]:
    """Every replica a write in `region` should reach, but the write endpoint itself."""
    servers, skipped = config.topology.reached_from(region, write_ep)
    for rep in skipped:
        # Probe keys are written there directly: it holds them at once, which
        # says nothing about replication. Say so rather than drop it silently.
        report.notes.append(
            f"replica {rep.name} ({rep.region or region.name}) is the write endpoint's own "
            f"address ({rep.host}:{rep.port}/{rep.db}): not observed"
        )
    return [_Target(region=r.name, replica=rep, cluster=bool(r.slots)) for r, rep in servers]


def _finish(run: _ProbeRun) -> None:
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
    _exclude_syncing(report, replication.syncing())
    if replication.event is not None:
        report.failovers.append(replication.event)
    report.evaluate(max_p99_s=settings.max_p99, max_loss=settings.max_loss)


def _exclude_syncing(report: ProbeReport, syncing: tuple[set[str], set[str]]) -> None:
    """A replica in a resync during the run: its samples time the sync (or are lost to
    it), so they are flagged and kept out of the figures, and a note says why. Syncing
    when the run started: every sample waited for the sync. Only when it ended: the
    sync began during the run, which matters where it cost probes."""
    at_start, at_end = syncing
    for pair in report.pairs:
        during = pair.replica in at_start or (pair.replica in at_end and pair.lost > 0)
        if during and pair.sent:
            count = pair.sent
            pair.exclude("syncing")
            report.samples = [s for s in report.samples if s.replica != pair.replica]
            report.notes.append(
                f"{pair.label}: the replica was syncing with its primary during the run "
                f"(a full or initial resync): its {count} samples are kept out of the "
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


def _no_clock(endpoint: str, exc: ReplagError) -> str:
    """The note for a server whose clock could not be read (TIME refused: an ACL user
    without it, a proxy that lacks it): its offset is missing from `clock`, not zero."""
    return f"{endpoint}: clock offset unknown (TIME failed: {exc.message})"


async def _time(conn: RespConnection) -> tuple[int, int]:
    seconds, micros = await conn.checked("TIME")
    return int(seconds), int(micros)


async def _open_writer_or_fallback(
    endpoint: Endpoint, fallbacks: tuple[Endpoint, ...], settings: Settings, report: ProbeReport
) -> RespConnection:
    """The write endpoint, else the first of its fallbacks (another rack's Dynomite client
    port) that answers; the report says which one was written through, and why."""
    failures: list[str] = []
    for candidate in (endpoint, *fallbacks):
        try:
            writer = await _open_writer(candidate, settings)
        except UnreachableError as exc:
            if not fallbacks:
                raise
            failures.append(f"{candidate.name} ({candidate.address}): {exc.message}")
            log.warning("%s: write endpoint %s unreachable: %s", report.source, candidate.name, exc)
            continue
        if failures:
            report.write_endpoint = candidate.url()
            report.notes.append(
                f"write endpoint unreachable ({'; '.join(failures)}): writing through "
                f"{candidate.name} ({candidate.address}) instead"
            )
        return writer
    raise UnreachableError(
        "no write endpoint answers: " + "; ".join(failures), where=f"region {report.source}"
    )


async def _open_writer(endpoint: Endpoint, settings: Settings) -> RespConnection:
    writer = await RespConnection.open(
        endpoint, timeout_s=settings.connect_timeout, clock=time.monotonic_ns
    )
    try:
        await writer.checked("PING")
        await require_on(writer, "probe", prefix=settings.prefix, what="a probe")
        if endpoint.kind == "dynomite" and settings.dynomite_consistency:
            await writer.checked("dyno_config:conn_consistency", settings.dynomite_consistency)
    except ReplagError:
        await writer.close()
        raise
    return writer


async def _open_target(
    target: _Target, keys: ProbeKeys, settings: Settings, report: ProbeReport
) -> None:
    """Connect to one replica and choose push or poll; failures land in report.unreachable."""
    replica = target.replica
    try:
        conn = await RespConnection.open(
            replica, timeout_s=settings.connect_timeout, clock=time.monotonic_ns
        )
        target.conn = conn
        await require_on(conn, "probe", prefix=settings.prefix, what="a probe")
        if target.cluster:
            # A Redis Cluster replica redirects reads to its primary unless told READONLY.
            await conn.checked("READONLY")
        try:
            report.clock.append(await estimate_offset(lambda: _time(conn), endpoint=replica.name))
        except ReplagError as exc:
            report.notes.append(_no_clock(replica.name, exc))
        observer = await open_observer(
            replica,
            conn,
            pattern=keys.pattern,
            mode=settings.mode,
            poll_interval_s=settings.poll_interval,
            timeout_s=settings.connect_timeout,
            notes=report.notes,
            subscribe=settings.prefix.encode() + b"*",
            may_configure=settings.allow_config_changes,
        )
        target.observer = observer
    except (TlsError, PermissionRefused) as exc:
        target.fatal = exc
    except ReplagError as exc:  # down, refusing, or not Redis at all: reported per replica
        target.error = exc.message
        report.unreachable.append(
            {"replica": replica.name, "region": target.region, "error": str(exc)}
        )


async def _write_keys(
    writer: RespConnection,
    keys: ProbeKeys,
    settings: Settings,
    observers: list[Observer],
    report: ProbeReport,
    progress: ProgressCallback | None = None,
    *,
    fence: Callable[[], None] | None = None,
) -> dict[int, tuple[int, int]]:
    """Write the run's keys at `settings.rate`; return seq -> (sent_ns, acked_ns)."""
    writes: dict[int, tuple[int, int]] = {}
    refused: dict[str, int] = {}  # error reply → how many writes got it
    ttl_ms = max(1, int(settings.ttl * 1000))
    interval = 1 / settings.rate if settings.rate else 0.0
    loop = asyncio.get_running_loop()
    start = loop.time()
    for seq in range(settings.count):
        if interval:
            delay = start + seq * interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        key = keys.key(seq)
        if fence is not None:
            fence()
        try:
            reply, t_a, t_b = await writer.call(
                "SET", key, keys.value(seq, time.time_ns()), "PX", ttl_ms
            )
        except ReplagError as exc:
            # The run goes on with what was written; the source itself is reported (exit 1).
            report.write_errors += 1
            report.unreachable.append(
                {
                    "replica": writer.endpoint.name,
                    "region": report.source,
                    "error": f"write endpoint failed after {len(writes)} writes: {exc}",
                }
            )
            break
        if isinstance(reply, hiredis.ReplyError):
            # Dynomite under DC_QUORUM answers an error yet may keep the local write.
            report.write_errors += 1
            report.write_error = report.write_error or str(reply)
            refused[str(reply)] = refused.get(str(reply), 0) + 1
            continue
        writes[seq] = (t_a, t_b)
        if progress is not None:
            progress(
                ProbeProgress(
                    source=report.source, phase="writing", done=seq + 1, total=settings.count
                )
            )
        report.write.record_ns(t_b - t_a)
        for obs in observers:
            obs.expect(key, t_a)
    # One line per distinct refusal, with its count: 200 OOM answers are one warning.
    for reply, count in refused.items():
        log.warning(
            "%d of %d probe writes to %s failed: %s",
            count,
            settings.count,
            writer.endpoint.name,
            reply,
        )
    if any(r.startswith(("MOVED ", "ASK ")) for r in refused):
        # The slot moved while the run wrote (a reshard under way): the next run re-reads
        # CLUSTER SHARDS and writes into a slot the shard holds then.
        report.notes.append(
            "the probe keys' slot moved during the run (MOVED/ASK): the next run re-reads "
            "the cluster's shards"
        )
    return writes


def _reporter(progress: ProgressCallback, source: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        progress(ProbeProgress(source=source, phase="waiting", done=done, total=total))

    return report


async def _wait_for_arrivals(
    units: list[list[Observer]],
    writes: dict[int, tuple[int, int]],
    timeout_s: float,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Until every unit (replica, or Dynomite rack) has seen every key, or the timeout."""
    if not writes:
        return
    deadline = max(t_b for _, t_b in writes.values()) + int(timeout_s * 1e9)
    want = len(writes)

    def waiting(unit: list[Observer]) -> bool:
        if all(o.error is not None for o in unit):
            return False
        return sum(len(o.arrivals) for o in unit) < want

    while time.monotonic_ns() < deadline:
        if progress is not None:
            seen = sum(min(want, sum(len(o.arrivals) for o in unit)) for unit in units)
            progress(seen, want * len(units))
        if not any(waiting(u) for u in units):
            return
        await asyncio.sleep(0.002)


async def _finish_watch(
    watch: RegionWatch,
    writes: dict[int, tuple[int, int]],
    timeout_s: float,
    clock_rounds: list[asyncio.Task[None]],
) -> None:
    """The agent waits for the keys on its side (one long poll), up to our own deadline."""
    await asyncio.gather(*clock_rounds)
    last = max((t_b for _, t_b in writes.values()), default=time.monotonic_ns())
    await watch.finish((last + int(timeout_s * 1e9) - time.monotonic_ns()) / 1e9)


def _observation_units(targets: list[_Target], *, by_rack: bool) -> list[list[_Target]]:
    """Targets whose arrivals count together: one rack of a Dynomite DC, else one replica.

    In a Dynomite rack of several nodes each key lives on the one node owning its
    token, so the rack (not each backend) is what received the write or not.
    """
    units: dict[tuple[str, str], list[_Target]] = {}
    for t in targets:
        units.setdefault(unit_key(t.region, t.replica, by_rack=by_rack), []).append(t)
    return list(units.values())


def _collect(
    report: ProbeReport,
    targets: list[_Target],
    writes: dict[int, tuple[int, int]],
    *,
    by_rack: bool = False,
) -> None:
    for unit in _observation_units(targets, by_rack=by_rack):
        first = unit[0]
        label, rack = unit_label([t.replica for t in unit], by_rack=by_rack)
        observers = [t.observer for t in unit if t.observer is not None]
        errors = [t for t in unit if t.error]
        pair = PairResult(
            source=report.source,
            target=first.region,
            replica=label,
            rack=rack,
            observed_by=observers[0].mode if observers else "-",
            sent=len(writes),
            error="; ".join(str(t.error) for t in errors) or None,
        )
        report.pairs.append(pair)
        if not observers:
            continue
        _record_lags(report, pair, first.region, writes, _first_arrivals(observers))
        for t in unit:
            if t.observer is not None and t.observer.error and pair.lost:
                pair.error = t.observer.error
                report.unreachable.append(
                    {
                        "replica": t.replica.name,
                        "region": t.region,
                        "error": f"{t.replica.name} ({t.replica.url()}): {t.observer.error}",
                    }
                )


def _first_arrivals(observers: list[Observer]) -> dict[int, Arrival]:
    """Probe seq → its earliest arrival seen by any of a unit's observers."""
    by_seq: dict[int, Arrival] = {}
    for obs in observers:
        for seq, seen in _arrivals_by_seq(obs).items():
            if seq not in by_seq or seen.estimate_ns < by_seq[seq].estimate_ns:
                by_seq[seq] = seen
    return by_seq


def within_chunks(
    by_seq: dict[int, Arrival], writes: dict[int, tuple[int, int]]
) -> dict[int, Arrival]:
    """Events read in one chunk, placed in their brackets by the lag of the chunk's own.

    Of several events read together only the last has an exact arrival (the chunk's
    kernel stamp); the others arrived between the previous read and then, and the
    middle of that bracket is a poor guess: after a quiet spell it lies long before
    their writes were even sent (a burst of writes then read as lagging half as much
    as it did). An event cannot precede its write, so the bracket starts there at the
    earliest; and neighbouring writes replicate alike, so each gets the lag of the
    chunk's exactly stamped events, kept inside its bracket. The bracket stays what was
    known, and the sample's uncertainty reaches its farther end from the estimate
    (`Arrival.error_bound_ns`): a borrowed lag is a guess, right only where the
    chunk-mates replicated alike (no jitter between them).
    """
    chunks: dict[int, list[int]] = {}
    for seq, arrival in by_seq.items():
        if seq in writes:
            chunks.setdefault(arrival.hi_ns, []).append(seq)
    out = dict(by_seq)
    for seqs in chunks.values():
        merged = [s for s in seqs if by_seq[s].merged]
        if not merged:
            continue
        exact = [by_seq[s].estimate_ns - sum(writes[s]) // 2 for s in seqs if not by_seq[s].merged]
        lag = sorted(exact)[len(exact) // 2] if exact else None
        for seq in merged:
            arrival, (t_a, t_b) = by_seq[seq], writes[seq]
            lo = max(arrival.lo_ns, t_a)
            guess = (lo + arrival.hi_ns) // 2 if lag is None else (t_a + t_b) // 2 + lag
            estimate = min(max(guess, lo), arrival.hi_ns)
            out[seq] = Arrival(estimate, lo, arrival.hi_ns, merged=True)
    return out


def _record_lags(
    report: ProbeReport,
    pair: PairResult,
    region: str,
    writes: dict[int, tuple[int, int]],
    by_seq: dict[int, Arrival],
) -> None:
    """Each write's lag (or its loss) into `pair`'s histograms and the report's samples."""
    by_seq = within_chunks(by_seq, writes)
    for seq, (t_a, t_b) in writes.items():
        arrival = by_seq.get(seq)
        if arrival is None:
            pair.lost += 1
            report.samples.append(ProbeSample(region, pair.replica, seq, None, 0))
            continue
        lag = arrival.estimate_ns - (t_a + t_b) // 2
        unc = arrival.error_bound_ns + (t_b - t_a) // 2
        # A lag close to 0 can read below it; the histogram counts it as negative
        # (recorded as 0), and one below even its uncertainty is counted apart.
        pair.lag.record_ns(lag)
        if lag + unc < 0:
            pair.negative_beyond_uncertainty += 1
        pair.uncertainty.record_ns(unc)
        report.samples.append(
            ProbeSample(region, pair.replica, seq, lag, unc, t_b - t_a, arrival.merged)
        )


def _arrivals_by_seq(observer: Observer) -> dict[int, Arrival]:
    out: dict[int, Arrival] = {}
    for key, arrival in observer.arrivals.items():
        tail = key.rsplit(b":", 1)[-1]
        if tail.isdigit():
            out[int(tail)] = arrival
    return out


async def _cleanup(writer: RespConnection, keys: list[bytes], report: ProbeReport) -> None:
    """Delete the run's keys, pipelined (they also carry a TTL, so a failure leaks nothing long)."""
    try:
        for i in range(0, len(keys), _CLEANUP_BATCH):
            futures = [writer.send(pack(b"DEL", key), 1) for key in keys[i : i + _CLEANUP_BATCH]]
            await asyncio.wait_for(asyncio.gather(*futures), writer.timeout_s)
    except (ReplagError, OSError, TimeoutError, ConnectionError) as exc:
        report.notes.append(f"could not delete probe keys ({exc}); they expire by their TTL")


def save_report(store: Store, report: ProbeReport) -> None:
    """One lag window per (source, target, replica), plus the run's summary."""
    windows = []
    for pair in report.pairs:
        window = LagWindow(
            run_id=report.run_id,
            source=report.source,
            target=pair.target,
            replica=pair.replica,
            start_ns=report.started_ns,
            end_ns=report.finished_ns,
            sent=pair.sent,
            seen=pair.seen,
            lost=pair.lost,
        )
        window.lag.merge(pair.lag)
        window.uncertainty.merge(pair.uncertainty)
        window.write.merge(report.write)
        windows.append(window)
    store.append_windows(windows)
    store.record_probe_run(
        run_id=report.run_id,
        started_ns=report.started_ns,
        source=report.source,
        mode=report.mode,
        # The histograms live in the windows; per run keep only what explains an outcome
        # (one row per source every probe interval adds up over the retention period).
        summary_json=json.dumps(
            {
                "sent": sum(p.sent for p in report.pairs),
                "lost": sum(p.lost for p in report.pairs),
                "write_errors": report.write_errors,
                "consistency": report.consistency,
                "unreachable": report.unreachable,
                "breaches": [b["message"] for b in report.breaches],
                "notes": report.notes,
            }
        ),
    )
