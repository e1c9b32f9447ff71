"""The probe's writes: the write endpoint (or the next of its fallbacks that answers),
the run's timestamped keys written at the configured rate, and their deletion after.

A write is stamped at the socket (`t_a` sent, `t_b` acknowledged) on this process's
monotonic clock; refusals are counted per distinct reply, one warning line each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import hiredis

from replag.errors import ReplagError, UnreachableError
from replag.probes.keys import ProbeKeys
from replag.probes.observers import Observer
from replag.probes.progress import ProbeProgress, ProgressCallback
from replag.probes.report import ProbeReport
from replag.settings import Settings
from replag.topology import Endpoint
from replag.wire.connector import Connector
from replag.wire.permissions import require_on
from replag.wire.resp import RespConnection, pack

log = logging.getLogger(__name__)
_CLEANUP_BATCH = 500


def no_clock_note(endpoint: str, exc: ReplagError) -> str:
    """The note for a server whose clock could not be read (TIME refused: an ACL user
    without it, a proxy that lacks it): its offset is missing from `clock`, not zero."""
    return f"{endpoint}: clock offset unknown (TIME failed: {exc.message})"


async def server_time(conn: RespConnection) -> tuple[int, int]:
    seconds, micros = await conn.checked("TIME")
    return int(seconds), int(micros)


async def open_writer_or_fallback(
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
    writer = await Connector(endpoint, timeout_s=settings.connect_timeout).open(
        clock=time.monotonic_ns
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


async def write_keys(
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
        lo_ns = time.monotonic_ns()  # the writer's clock: at or before the send
        for obs in observers:
            obs.sending(key, lo_ns)
        try:
            reply, t_a, t_b = await writer.call(
                "SET", key, keys.value(seq, time.time_ns()), "PX", ttl_ms
            )
        except ReplagError as exc:
            for obs in observers:
                obs.withdraw(key)
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
            for obs in observers:
                obs.withdraw(key)
            continue
        writes[seq] = (t_a, t_b)
        read = writer.last_read
        if read is None or not read.kernel:
            report.loop_stamped_writes.add(seq)
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


async def delete_keys(writer: RespConnection, keys: list[bytes], report: ProbeReport) -> None:
    """Delete the run's keys, pipelined (they also carry a TTL, so a failure leaks nothing long)."""
    try:
        for i in range(0, len(keys), _CLEANUP_BATCH):
            futures = [writer.send(pack(b"DEL", key), 1) for key in keys[i : i + _CLEANUP_BATCH]]
            await asyncio.wait_for(asyncio.gather(*futures), writer.timeout_s)
    except (ReplagError, OSError, TimeoutError, ConnectionError) as exc:
        report.notes.append(f"could not delete probe keys ({exc}); they expire by their TTL")
