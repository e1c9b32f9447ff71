"""The probe round of one source region: write probes there, observe every replica.

One `ProbeRound` per region with a write endpoint (a Redis Cluster shard is a
region), each on its own `probe_interval` timer. A round records its outcome
for health, feeds the metrics and the replication state, and asks for an
alert evaluation when it ends.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from replag.alerts.health import record_probe
from replag.config import Config
from replag.errors import DiscoveryError, EndpointError, StoreError
from replag.metrics import ServiceMetrics
from replag.probes.report import ProbeReport
from replag.probes.targets import observed_replicas
from replag.service.leasing import Fence
from replag.service.replication import ReplicationState
from replag.service.scheduler import Claim
from replag.store import Store

log = logging.getLogger("replag.service")

ProbeFunction = Callable[..., Awaitable[ProbeReport]]


class ProbeRound:
    """Probes from one source region every `probe_interval`."""

    claim: Claim = "lease"
    # Rounds of many regions spread over the interval, not all at once (Scheduler).
    staggered = True

    def __init__(
        self,
        config: Config,
        *,
        source: str,
        write_name: str,
        probe: ProbeFunction,
        store: Store,
        metrics: ServiceMetrics,
        counters: Counter[str],
        replication: ReplicationState,
        evaluate_alerts: Callable[[], Awaitable[None]],
    ) -> None:
        self.config = config
        self.source = source
        self.write_name = write_name
        self.name = f"probe:{source}"
        self.interval_s = config.settings.probe_interval
        self._probe = probe
        self.store = store
        self.metrics = metrics
        self.counters = counters
        self.replication = replication
        self.evaluate_alerts = evaluate_alerts
        # Replicas whose last probe saw nothing: logged once per spell.
        self._silent: set[str] = set()
        # Every replica's lag, sent and lost series exist from the start, at 0.
        topology = config.topology
        metrics.expect_replicas(observed_replicas(topology, topology.region(source)))

    async def run(self, fence: Fence | None = None) -> ProbeReport | None:
        """Probe, then evaluate the alerts (what the scheduler runs)."""
        report = await self.probe(fence)
        await self.evaluate_alerts()
        return report

    async def probe(self, fence: Fence | None = None) -> ProbeReport | None:
        """One probe run from this source; None when its write endpoint failed. Under a
        `fence`, every probe write and the stored results wait on it (`LeaseLost`)."""
        source = self.source
        fenced = {} if fence is None else {"fence": fence.check}
        try:
            report = await self._probe(self.config, source=source, store=self.store, **fenced)
        except (EndpointError, DiscoveryError) as exc:
            # A server down, refusing, answering in the wrong shape or naming a host
            # outside allow_networks; a Sentinel that knows no such master: a problem
            # in health and the alerts, one line in the log.
            self.counters["probe errors"] += 1
            self.metrics.probe_runs.labels(source, "ok")  # the series exists, at 0
            self.metrics.probe_runs.labels(source, "error").inc()
            record_probe(
                self.store,
                source=source,
                run_id=None,
                error=str(exc),
                unreachable=[{"replica": self.write_name, "region": source, "error": str(exc)}],
            )
            log.warning("probe from %s failed: %s", source, exc)
            return None
        except StoreError as exc:
            # Not the replicas: the store (damaged pages, a bug). Counted and said as such;
            # a store that is only full never gets here (its writes wait in memory).
            self.counters["probe errors"] += 1
            self.metrics.probe_runs.labels(source, "ok")
            self.metrics.probe_runs.labels(source, "error").inc()
            log.error("probe from %s failed on the store: %s", source, exc)
            with contextlib.suppress(StoreError):
                record_probe(self.store, source=source, run_id=None, error=str(exc), unreachable=[])
            return None
        self.counters["probe runs"] += 1
        self._log_silent_replicas(report)
        if report.replication is not None:
            self.replication.observe(report.replication)
        for event in report.failovers:
            self.metrics.replication.failover(source)
            log.warning("%s", event.render())
        self.metrics.observe_probe(
            source=source,
            replicas=[(p.target, p.replica, p.rack) for p in report.pairs],
            samples=report.samples,
            write=report.write,
            unreachable=len(report.unreachable),
            finished_s=time.time(),
        )
        record_probe(
            self.store,
            source=source,
            run_id=report.run_id,
            error=None,
            unreachable=list(report.unreachable),
        )
        return report

    def disown(self) -> None:
        """Another instance probes from this source now: its gauges are that one's."""
        self.metrics.forget_probe_gauges(self.source)

    def _log_silent_replicas(self, report: ProbeReport) -> None:
        """Log when a replica starts and stops losing every probe (reachable, not replicating)."""
        for pair in report.pairs:
            silent = pair.error is None and pair.sent > 0 and pair.seen == 0
            if silent and pair.replica not in self._silent:
                self._silent.add(pair.replica)
                log.warning(
                    "%s→%s: replica %s saw none of %d probes within %gs: reachable but not "
                    "replicating",
                    report.source,
                    pair.target,
                    pair.replica,
                    pair.sent,
                    self.config.settings.timeout,
                    extra={"replica": pair.replica},
                )
            elif not silent and pair.replica in self._silent and pair.error is None:
                self._silent.discard(pair.replica)
                log.info(
                    "%s→%s: replica %s replicating again (%d of %d probes seen)",
                    report.source,
                    pair.target,
                    pair.replica,
                    pair.seen,
                    pair.sent,
                    extra={"replica": pair.replica},
                )
