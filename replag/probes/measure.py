"""The measuring part of one probe run: every replica connected and watched, the keys
written, their arrivals awaited, the samples collected; `ProbeRun.close()` ends every
connection, subscription and poll task, also on error or cancellation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replag.clock import estimate_offset
from replag.errors import PermissionRefused, ReplagError, ReplyShapeError, TlsError
from replag.probes.keys import ProbeKeys
from replag.probes.observers import Observer, open_observer
from replag.probes.progress import ProgressCallback, waiting_reporter
from replag.probes.report import ProbeReport
from replag.probes.samples import collect_samples
from replag.probes.setup import ProbeSetup
from replag.probes.targets import ReplicaTarget, observation_units, unit_label
from replag.probes.writes import delete_keys, no_clock_note, server_time, write_keys
from replag.replication.alongside import ProbeReplication
from replag.settings import Settings
from replag.wire.permissions import require_on
from replag.wire.resp import RespConnection, error_text

if TYPE_CHECKING:
    from replag.probes.remote import RegionWatch


@dataclass(kw_only=True)
class ProbeRun:
    """One run's open connections and what it measures; `close()` ends them all."""

    settings: Settings
    keys: ProbeKeys
    report: ProbeReport
    replication: ProbeReplication
    writer: RespConnection
    targets: list[ReplicaTarget]
    setup: ProbeSetup
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
                open_target(t, self.keys, settings, report)
                for t in self.targets
                if t.observer is None
            )
        )
        for target in self.targets:
            if target.fatal is not None:
                raise target.fatal
        if writer.endpoint.kind == "redis":
            try:
                offset = await estimate_offset(
                    lambda: server_time(writer), endpoint=writer.endpoint.name
                )
                report.clock.insert(0, offset)
            except ReplyShapeError:
                raise  # not a refused TIME: a server answering what no Redis would
            except ReplagError as exc:
                report.notes.append(no_clock_note(writer.endpoint.name, exc))
        # A replica found unreachable (a stall, a reply over a limit) is not asked again
        # in this run: each ask would wait out its own timeout.
        down = {t.replica.name: t.error for t in self.targets if t.error is not None}
        await self.replication.sample_start(down)
        live = [t.observer for t in self.targets if t.observer is not None]
        for obs in live:
            await obs.start()
        # The agents' clocks are compared with ours while the keys are written.
        self.clock_rounds += [asyncio.create_task(w.sample_clock()) for w in self.watches]
        writes = await write_keys(
            writer, self.keys, settings, live, report, progress, fence=self.fence
        )
        units = [
            [t.observer for t in unit if t.observer is not None and t.replica.name not in remote]
            for unit in observation_units(self.targets, by_rack=self.by_rack)
        ]
        await asyncio.gather(
            wait_for_arrivals(
                [u for u in units if u],
                writes,
                settings.timeout,
                None if progress is None else waiting_reporter(progress, report.source),
            ),
            *(finish_watch(w, writes, settings.timeout, self.clock_rounds) for w in self.watches),
        )
        for obs in live:
            await obs.stop()
        await self.replication.sample_end()
        collect_samples(report, self.targets, writes, by_rack=self.by_rack, key_of=self.keys.key)
        if self.fence is not None:
            self.fence()
        await delete_keys(writer, [self.keys.key(seq) for seq in writes], report)

    def loading(self) -> set[str]:
        """Units (by label) a replica of which answered LOADING during the run."""
        out = set()
        for unit in observation_units(self.targets, by_rack=self.by_rack):
            if any(t.loading or (t.observer is not None and t.observer.loading) for t in unit):
                out.add(unit_label([t.replica for t in unit], by_rack=self.by_rack)[0])
        return out

    async def _open_watches(self) -> set[str]:
        """Have the agents of agent regions watch their replicas; the replicas' names."""
        if not any(self.setup.topology.region(t.region).agent for t in self.targets):
            return set()
        # Only runs with agents load their HTTP client (and what it brings: aiohttp, numpy).
        from replag.probes.agents import open_region_watches

        self.watches = await open_region_watches(
            self.setup,
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


async def open_target(
    target: ReplicaTarget, keys: ProbeKeys, settings: Settings, report: ProbeReport
) -> None:
    """Connect to one replica and choose push or poll; failures land in report.unreachable."""
    replica = target.replica
    try:
        conn = await RespConnection.open(
            replica, timeout_s=settings.connect_timeout, clock=time.monotonic_ns
        )
        target.conn = conn
        await require_on(conn, "probe", prefix=settings.prefix, what="a probe")
        # A replica refusing us (NOAUTH, a wrong password) is unreachable from the start;
        # one loading its dataset answers LOADING, and is observed all the same.
        reply, _, _ = await conn.call("PING")
        if (text := error_text(reply)) is not None and text.startswith("LOADING"):
            target.loading = True
        elif text is not None:
            conn.check([reply])
        if target.cluster:
            # A Redis Cluster replica redirects reads to its primary unless told READONLY.
            await conn.checked("READONLY")
        try:
            report.clock.append(
                await estimate_offset(lambda: server_time(conn), endpoint=replica.name)
            )
        except ReplyShapeError:
            raise
        except ReplagError as exc:
            report.notes.append(no_clock_note(replica.name, exc))
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
            declared=settings.notify_keyspace_events,
        )
        target.observer = observer
    except (TlsError, PermissionRefused) as exc:
        target.fatal = exc
    except ReplagError as exc:  # down, refusing, or not Redis at all: reported per replica
        target.error = exc.message
        report.unreachable.append(
            {"replica": replica.name, "region": target.region, "error": str(exc)}
        )


async def wait_for_arrivals(
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
            seen = sum(min(want, sum(o.seen() for o in unit)) for unit in units)
            progress(seen, want * len(units))
        if not any(waiting(u) for u in units):
            return
        await asyncio.sleep(0.002)


async def finish_watch(
    watch: RegionWatch,
    writes: dict[int, tuple[int, int]],
    timeout_s: float,
    clock_rounds: list[asyncio.Task[None]],
) -> None:
    """The agent waits for the keys on its side (one long poll), up to our own deadline."""
    await asyncio.gather(*clock_rounds)
    last = max((t_b for _, t_b in writes.values()), default=time.monotonic_ns())
    await watch.finish((last + int(timeout_s * 1e9) - time.monotonic_ns()) / 1e9)
