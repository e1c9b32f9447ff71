"""A probe run's results into the store: one lag window per (source, target, replica)."""

from __future__ import annotations

import json

from replag.probes.report import ProbeReport
from replag.store import LagWindow, Store


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
