"""What one probe run found: samples, per-pair histograms, breaches; JSON and a table."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from replag.clock import ClockOffset
from replag.durations import format_ms
from replag.errors import EXIT_BREACH, EXIT_OK, EXIT_UNREACHABLE
from replag.histogram import LagHistogram, LagSummary
from replag.replication.follow import FailoverEvent
from replag.replication.sampler import DYNOMITE_NOTE
from replag.replication.state import ReplicationSnapshot
from replag.schemas.parts import SCHEMA_VERSION


@dataclass(frozen=True, slots=True)
class ProbeSample:
    target: str
    replica: str
    seq: int
    lag_ns: int | None  # None: not seen before the timeout (lost)
    uncertainty_ns: int
    write_ns: int = 0  # the write's round trip (send to acknowledgement), part of the uncertainty
    # Read in one chunk with later events: placed inside its bracket (`within_chunks`).
    placed_by_chunk: bool = False
    key: str = ""
    source: str = ""
    mode: str = ""  # how the replica was observed: push, poll, agent/push, agent/poll
    # How the arrival was stamped (`Arrival.stamp`: kernel, loop, chunk-placed, widened;
    # "" when lost) and by how much its bar was widened; how the write's acknowledgement was.
    stamp: str = ""
    widened_ns: int = 0
    write_stamp: str = "kernel"

    def to_line(self) -> dict[str, Any]:
        """One line of `replag probe --samples-out` (`replag schema samples`)."""
        mode, _, remote = self.mode.partition("/")
        return {
            "schema_version": SCHEMA_VERSION,
            "key": self.key,
            "seq": self.seq,
            "source": self.source,
            "target": self.target,
            "replica": self.replica,
            "lag_ms": None if self.lag_ns is None else self.lag_ns / 1e6,
            "uncertainty_ms": None if self.lag_ns is None else self.uncertainty_ns / 1e6,
            "mode": remote or mode,
            "agent": bool(remote),
            "stamp": self.stamp or None,
            "widened_ms": self.widened_ns / 1e6,
            "write_rtt_ms": self.write_ns / 1e6,
            "write_stamp": self.write_stamp,
        }


@dataclass(kw_only=True)
class PairResult:
    """One (source region, target region, replica)."""

    source: str
    target: str
    replica: str
    observed_by: str
    rack: str | None = None  # the Dynomite rack the replica is (or is in)
    sent: int = 0
    lag: LagHistogram = field(default_factory=LagHistogram)
    uncertainty: LagHistogram = field(default_factory=LagHistogram)
    lost: int = 0
    error: str | None = None
    # The Dynomite write consistency set on the probe connection (None: not set).
    consistency: str | None = None
    negative_beyond_uncertainty: int = 0  # lag + uncertainty < 0: an estimate gone wrong
    # Samples kept out of the figures, and why ("syncing": the replica was in a resync;
    # "loading": it was loading its dataset).
    excluded: int = 0
    excluded_because: str | None = None
    # How the seen samples were stamped (`ProbeSample.stamp`: kernel, loop, chunk-placed,
    # widened) → how many.
    stamps: dict[str, int] = field(default_factory=dict)

    @property
    def seen(self) -> int:
        return self.lag.count

    @property
    def summary(self) -> LagSummary:
        unc = self.uncertainty.summary_ms()
        return LagSummary(
            source=self.source,
            target=self.target,
            replica=self.replica,
            sent=self.sent,
            seen=self.seen,
            lost=self.lost,
            lag_ms=self.lag.summary_ms(),
            uncertainty_ms={"p50": unc["p50"], "max": unc["max"]},
            out_of_range=self.lag.out_of_range,
        )

    def to_dict(self) -> dict[str, Any]:
        out = self.summary.to_dict()
        out["consistency"] = self.consistency
        out["rack"] = self.rack
        out["observed_by"] = self.observed_by
        out["negative"] = {
            "count": self.lag.negative,
            "beyond_uncertainty": self.negative_beyond_uncertainty,
        }
        out["error"] = self.error
        out["excluded"] = {"count": self.excluded, "because": self.excluded_because}
        out["stamps"] = dict(sorted(self.stamps.items()))
        return out

    def exclude(self, because: str) -> None:
        """Keep every sample of this run out of the percentiles and the loss ratio."""
        self.excluded, self.excluded_because = self.sent, because
        self.sent = self.lost = 0
        self.lag, self.uncertainty = LagHistogram(), LagHistogram()
        self.negative_beyond_uncertainty = 0
        self.stamps = {}

    @property
    def label(self) -> str:
        """`source→replica`, with the consistency level when one was set."""
        at = f" at {self.consistency}" if self.consistency else ""
        return f"{self.source}→{self.replica}{at}"


@dataclass(kw_only=True)
class ProbeReport:
    run_id: str
    source: str
    mode: str
    started_ns: int
    finished_ns: int = 0
    write_endpoint: str = ""
    consistency: str | None = None
    # What the Dynomite cluster itself runs with ({"read", "write", "from"}), when known.
    cluster_consistency: dict[str, str] | None = None
    pairs: list[PairResult] = field(default_factory=list)
    samples: list[ProbeSample] = field(default_factory=list)
    write: LagHistogram = field(default_factory=LagHistogram)
    write_errors: int = 0
    write_error: str | None = None  # the first error a probe write was answered with
    # Writes whose acknowledgement had no kernel stamp (stamped when read: later).
    loop_stamped_writes: set[int] = field(default_factory=set)
    clock: list[ClockOffset] = field(default_factory=list)
    # Regions observed by their agent: its URL, replicas, and the clock comparison.
    agents: list[dict[str, Any]] = field(default_factory=list)
    unreachable: list[dict[str, str]] = field(default_factory=list)
    breaches: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seed_method: list[dict[str, Any]] | None = None
    # Filled when runs at several Dynomite consistency levels are combined.
    write_by_consistency: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Replication state sampled at the end of the run, and Sentinel failovers followed.
    replication: ReplicationSnapshot | None = None
    failovers: list[FailoverEvent] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """3 when a replica could not be measured (whatever else), 1 on a breach, else 0."""
        if self.unreachable:
            return EXIT_UNREACHABLE
        return EXIT_BREACH if self.breaches else EXIT_OK

    def evaluate(self, *, max_p99_s: float | None, max_loss: float | None) -> None:
        """Fill `breaches` from the thresholds (None = not checked).

        Probe writes answered with an error are a breach whatever the thresholds: the
        write path itself is failing (e.g. Dynomite under DC_QUORUM with racks down).
        """
        self.breaches = [
            {
                "kind": "unreachable",
                "source": self.source,
                "target": u["region"],
                "replica": u["replica"],
                "consistency": self.consistency,
                "message": f"{u['replica']} ({u['region']}): {u['error']}",
            }
            for u in self.unreachable
        ]
        if self.write_error is not None:
            self.breaches.append(
                {
                    "kind": "write_errors",
                    "source": self.source,
                    "consistency": self.consistency,
                    "value": self.write_errors,
                    "message": f"{self.source}: {self.write_errors} probe writes answered an "
                    f"error at {self.write_endpoint}: {self.write_error}",
                }
            )
        for pair in self.pairs:
            s = pair.summary
            p99 = s.lag_ms["p99"]
            where = {
                "source": s.source,
                "target": s.target,
                "replica": s.replica,
                "consistency": pair.consistency,
            }
            if max_p99_s is not None and p99 is not None and p99 > max_p99_s * 1000:
                self.breaches.append(
                    {
                        "kind": "p99",
                        **where,
                        "value_ms": p99,
                        "limit_ms": max_p99_s * 1000,
                        "message": f"{pair.label}: p99 {format_ms(p99)} ms > "
                        f"{format_ms(max_p99_s * 1000)} ms",
                    }
                )
            if max_loss is not None and pair.error is None and s.sent and s.loss_ratio > max_loss:
                self.breaches.append(
                    {
                        "kind": "loss",
                        **where,
                        "value": round(s.loss_ratio, 6),
                        "limit": max_loss,
                        "message": f"{pair.label}: lost {s.lost}/{s.sent} "
                        f"({s.loss_ratio:.1%}) > {max_loss:.1%}",
                    }
                )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "source": self.source,
            "write_endpoint": self.write_endpoint,
            "mode": self.mode,
            "consistency": self.consistency,
            "cluster_consistency": self.cluster_consistency,
            "started": _iso(self.started_ns),
            "duration_s": round((self.finished_ns - self.started_ns) / 1e9, 3),
            "pairs": [self._with_replication(p.to_dict()) for p in self.pairs],
            "write_ms": {
                "count": self.write.count,
                "errors": self.write_errors,
                **self.write.summary_ms(),
            },
            "clock": [c.to_dict() for c in self.clock],
            "agents": self.agents,
            "unreachable": self.unreachable,
            "breaches": self.breaches,
            "notes": self.notes,
            **({"dynomite_seed": self.seed_method} if self.seed_method is not None else {}),
            **(
                {"write_ms_by_consistency": self.write_by_consistency}
                if self.write_by_consistency
                else {}
            ),
            "replication": self.replication.to_dict() if self.replication else None,
            "failovers": [f.to_dict() for f in self.failovers],
        }

    def _with_replication(self, pair: dict[str, Any]) -> dict[str, Any]:
        """A pair's `replication` section: its replica's offsets, link and headroom."""
        state = self.replication.replica(pair["replica"]) if self.replication else None
        if state is not None:
            pair["replication"] = state.to_dict()
        elif self.consistency is not None:  # written through Dynomite
            pair["replication"] = {"offsets": None, "note": DYNOMITE_NOTE}
        else:
            pair["replication"] = None
        return pair

    def render(self) -> str:
        """The human table: one row per pair, with source and consistency columns when
        the report covers several sources or consistency levels."""
        lines = [self._title(), "", *self._pair_table()]
        lines.append(
            "(lag in ms; ±p50 = median of the samples' uncertainties: how far a true lag can lie)"
        )
        if self.write_by_consistency:
            for level, w in self.write_by_consistency.items():
                lines.append(f"write ack ms at {level}: " + _write_line(w, int(w["errors"])))
        else:
            lines.append("write ack ms: " + _write_line(self.write.summary_ms(), self.write_errors))
        if self.clock:
            lines.append(
                "clock offset vs prober: "
                + ", ".join(
                    f"{c.endpoint} {c.offset_ns / 1e6:+.3f} ms (±{c.uncertainty_ns / 1e6:.3f})"
                    for c in self.clock
                )
            )
        lines += [_agent_line(agent) for agent in self.agents]
        lines += self._seed_method_lines()
        if self.replication is not None and (self.replication.primaries or self.replication.notes):
            lines += self.replication.render()
        lines += [f"note: {n}" for n in self.notes + self._negative_notes()]
        lines += [f.render() for f in self.failovers]
        lines += [f"BREACH: {b['message']}" for b in self.breaches if b["kind"] != "unreachable"]
        lines += [
            f"UNREACHABLE: {u['replica']} ({u['region']}): {u['error']}" for u in self.unreachable
        ]
        return "\n".join(lines)

    def _title(self) -> str:
        sent = max((p.sent for p in self.pairs), default=0)
        return (
            f"probe run {self.run_id} from {self.source} ({self.write_endpoint}), "
            f"{sent} probes, {(self.finished_ns - self.started_ns) / 1e9:.1f} s"
            + (f", write consistency {self.consistency}" if self.consistency else "")
            + (
                f" (cluster runs read {self.cluster_consistency['read']}, "
                f"write {self.cluster_consistency['write']})"
                if self.cluster_consistency
                else ""
            )
        )

    def _pair_table(self) -> list[str]:
        """The column header and one row per pair."""
        sources = list(dict.fromkeys(p.source for p in self.pairs)) or [self.source]
        levels = list(dict.fromkeys(p.consistency for p in self.pairs if p.consistency))
        by_source, by_level = len(sources) > 1, len(levels) > 1
        via = max([4, *(len(p.observed_by) for p in self.pairs)])
        lines = [
            (f"{'source':<12} " if by_source else "")
            + (f"{'consistency':<14} " if by_level else "")
            + f"{'target':<12} {'replica':<18} {'via':<{via}} {'sent':>5} {'seen':>5} {'lost':>5} "
            f"{'mean':>8} {'p50':>8} {'p90':>8} {'p99':>8} {'p99.9':>8} {'max':>8} {'±p50':>7}",
        ]
        for pair in self.pairs:
            s = pair.summary
            head = (f"{s.source:<12} " if by_source else "") + (
                f"{pair.consistency or '-':<14} " if by_level else ""
            )
            if pair.error:
                lines.append(
                    f"{head}{s.target:<12} {s.replica:<18} {'-':<{via}} UNREACHABLE: {pair.error}"
                )
                continue
            if pair.excluded_because:
                lines.append(
                    f"{head}{s.target:<12} {s.replica:<18} {pair.observed_by:<{via}} "
                    f"{pair.excluded_because.upper()}: {pair.excluded} samples kept out"
                )
                continue
            lines.append(
                f"{head}{s.target:<12} {s.replica:<18} {pair.observed_by:<{via}} {s.sent:>5} "
                f"{s.seen:>5} {s.lost:>5} "
                + " ".join(
                    f"{format_ms(s.lag_ms[k]):>8}"
                    for k in ("mean", "p50", "p90", "p99", "p999", "max")
                )
                + f" {format_ms(s.uncertainty_ms['p50']):>7}"
            )
        return lines

    def _seed_method_lines(self) -> list[str]:
        if not self.seed_method:
            return []
        lines = ["dynomite-seed method (write 1000, poll 20 random keys, average):"]
        seed_sources = {row.get("source") for row in self.seed_method}
        for row in self.seed_method:
            lines.append(
                "  "
                + (f"{row['source']}→" if len(seed_sources) > 1 else "")
                + f"{row['target']:<12} {row['replica']:<18} "
                f"avg {format_ms(row['avg_ms'])} ms over {row['keys']} keys"
            )
        return lines

    def _negative_notes(self) -> list[str]:
        """Pairs with lag samples below zero: counted (recorded as 0), never hidden."""
        out = []
        for pair in self.pairs:
            if pair.lag.negative:
                beyond = pair.negative_beyond_uncertainty
                out.append(
                    f"{pair.label}: {pair.lag.negative} of {pair.seen} lag samples read below "
                    "0 and were recorded as 0 ("
                    + (
                        f"{beyond} below even their uncertainty"
                        if beyond
                        else "all within their uncertainty"
                    )
                    + ")"
                )
        return out


def _agent_line(agent: dict[str, Any]) -> str:
    """What one region's agent observed, and how its clock compared."""
    clock = agent["clock"] or {}
    bound = "clock not compared"
    if clock.get("bound_ms") is not None:
        bound = (
            f"clock {clock['offset_ms']:+.3f} ms ± {clock['bound_ms']:.3f} ms ({clock['source']})"
        )
    return (
        f"agent of {agent['region']} ({agent['agent']}): observed "
        f"{', '.join(agent['replicas'])}; {bound}"
        + (f"; ERROR {agent['error']}" if agent["error"] else "")
        + (f"; {clock['note']}" if clock.get("note") else "")
    )


def _write_line(w: dict[str, Any], errors: int) -> str:
    return (
        f"mean {format_ms(w['mean'])}  p50 {format_ms(w['p50'])}  "
        f"p99 {format_ms(w['p99'])}  max {format_ms(w['max'])}"
        + (f"  errors {errors}" if errors else "")
    )


def _iso(ns: int) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns / 1e9)) + f".{ns % 10**9 // 10**6:03d}Z"
    )


def combine_reports(reports: list[ProbeReport]) -> ProbeReport:
    """One report over several sources' runs (pairs, samples and breaches side by side)."""
    if len(reports) == 1:
        return reports[0]
    first = reports[0]
    sources = list(dict.fromkeys(r.source for r in reports))
    out = ProbeReport(
        run_id=",".join(r.run_id for r in reports),
        source=sources[0] if len(sources) == 1 else "all",
        mode=first.mode,
        started_ns=min(r.started_ns for r in reports),
        finished_ns=max(r.finished_ns for r in reports),
        write_endpoint=", ".join(dict.fromkeys(r.write_endpoint for r in reports)),
        consistency=first.consistency,
        cluster_consistency=first.cluster_consistency,
    )
    by_level = len({r.consistency for r in reports}) > 1
    if by_level:
        out.consistency = ", ".join(str(r.consistency) for r in reports)
    for r in reports:
        label = {"source": r.source} if len(sources) > 1 else {}
        if by_level:
            label["consistency"] = str(r.consistency)
        _merge_run(out, r, label, by_level=by_level)
    out.clock = _tightest_clocks(reports)
    return out


def _merge_run(out: ProbeReport, r: ProbeReport, label: dict[str, str], *, by_level: bool) -> None:
    """One run's pairs, samples, writes and findings into `out`, its rows labelled (source,
    consistency) where the combined report spans several."""
    out.pairs += r.pairs
    out.samples += r.samples
    out.write.merge(r.write)
    out.write_errors += r.write_errors
    out.unreachable += [{**u, **label} for u in r.unreachable]
    out.breaches += r.breaches
    prefix = " ".join(label.values())
    out.notes += [f"{prefix}: {n}" if prefix else n for n in r.notes]
    out.failovers += r.failovers
    if r.replication is not None:
        if out.replication is None:
            out.replication = ReplicationSnapshot()
        out.replication.merge(r.replication)
    out.agents += [{**a, "source": r.source} for a in r.agents]
    if by_level and r.consistency:
        out.write_by_consistency[r.consistency] = {
            "count": r.write.count,
            "errors": r.write_errors,
            **r.write.summary_ms(),
        }


def _tightest_clocks(reports: list[ProbeReport]) -> list[ClockOffset]:
    """One clock offset per server: the same server read by several runs keeps the tightest."""
    clock: dict[str, ClockOffset] = {}
    for r in reports:
        for c in r.clock:
            if c.endpoint not in clock or c.rtt_ns < clock[c.endpoint].rtt_ns:
                clock[c.endpoint] = c
    return list(clock.values())
