"""From arrivals to lag samples: each write's lag (or loss) per unit of observation.

A sample's lag is (estimated replica apply moment) minus (midpoint of the write's
send and acknowledgement); its uncertainty is the half-width of the arrival's
bracket (to its farther end where the estimate was placed in it) plus half the
write round trip.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from replag.probes.observers import Arrival, Observer
from replag.probes.report import PairResult, ProbeReport, ProbeSample
from replag.probes.targets import ReplicaTarget, observation_units, unit_label


def collect_samples(
    report: ProbeReport,
    targets: list[ReplicaTarget],
    writes: dict[int, tuple[int, int]],
    *,
    by_rack: bool = False,
    key_of: Callable[[int], bytes] | None = None,
) -> None:
    """Every write's sample on every unit; `key_of` names a write's key (for the samples)."""
    for unit in observation_units(targets, by_rack=by_rack):
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
            # None of the unit's replicas could be asked: none of its probes was seen, so
            # all are lost, in the store and the API as on the dashboard's tile and chart
            # (a stopped replica is never "0 % lost"). No samples: the metrics' counters
            # leave the unreachable replica to replag_unreachable_replicas.
            pair.lost = pair.sent
            continue
        _record_lags(report, pair, first.region, writes, _first_arrivals(observers), key_of)
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

    A chunk read at once after it arrived (`Arrival.prompt`) is not a reader that fell
    behind: its events arrived together, held back by a late one before them, and keep
    the chunk's arrival. The rest of this applies to chunks read late.

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
        for seq in seqs:
            # Read at once: the events arrived with the chunk, whose arrival each keeps;
            # only its bracket is cut to start at its write.
            arrival = by_seq[seq]
            if arrival.merged and arrival.prompt:
                lo = min(max(arrival.lo_ns, writes[seq][0]), arrival.hi_ns)
                estimate = min(max(arrival.estimate_ns, lo), arrival.hi_ns)
                out[seq] = dataclasses.replace(arrival, estimate_ns=estimate, lo_ns=lo)
        merged = [s for s in seqs if by_seq[s].merged and not by_seq[s].prompt]
        if not merged:
            continue
        exact = [by_seq[s].estimate_ns - sum(writes[s]) // 2 for s in seqs if not by_seq[s].merged]
        lag = sorted(exact)[len(exact) // 2] if exact else None
        for seq in merged:
            arrival, (t_a, t_b) = by_seq[seq], writes[seq]
            lo = max(arrival.lo_ns, t_a)
            guess = (lo + arrival.hi_ns) // 2 if lag is None else (t_a + t_b) // 2 + lag
            estimate = min(max(guess, lo), arrival.hi_ns)
            out[seq] = dataclasses.replace(arrival, estimate_ns=estimate, lo_ns=lo)
    return out


def _record_lags(
    report: ProbeReport,
    pair: PairResult,
    region: str,
    writes: dict[int, tuple[int, int]],
    by_seq: dict[int, Arrival],
    key_of: Callable[[int], bytes] | None,
) -> None:
    """Each write's lag (or its loss) into `pair`'s histograms and the report's samples."""
    by_seq = within_chunks(by_seq, writes)
    for seq, (t_a, t_b) in writes.items():
        arrival = by_seq.get(seq)
        sample = ProbeSample(
            region,
            pair.replica,
            seq,
            None,
            0,
            t_b - t_a,
            key=key_of(seq).decode("utf-8", "backslashreplace") if key_of else "",
            source=pair.source,
            mode=pair.observed_by,
            write_stamp="loop" if seq in report.loop_stamped_writes else "kernel",
        )
        if arrival is None:
            pair.lost += 1
            report.samples.append(sample)
            continue
        lag = arrival.estimate_ns - (t_a + t_b) // 2
        unc = arrival.error_bound_ns + (t_b - t_a) // 2
        # A lag close to 0 can read below it; the histogram counts it as negative
        # (recorded as 0), and one below even its uncertainty is counted apart.
        pair.lag.record_ns(lag)
        if lag + unc < 0:
            pair.negative_beyond_uncertainty += 1
        pair.uncertainty.record_ns(unc)
        pair.stamps[arrival.stamp] = pair.stamps.get(arrival.stamp, 0) + 1
        report.samples.append(
            dataclasses.replace(
                sample,
                lag_ns=lag,
                uncertainty_ns=unc,
                placed_by_chunk=arrival.merged,
                stamp=arrival.stamp,
                widened_ns=arrival.widened_ns,
            )
        )


def _arrivals_by_seq(observer: Observer) -> dict[int, Arrival]:
    out: dict[int, Arrival] = {}
    for key, arrival in observer.arrivals.items():
        tail = key.rsplit(b":", 1)[-1]
        if tail.isdigit():
            out[int(tail)] = arrival
    return out
