"""A probe run, or a failover check, as a Nagios/Icinga plugin line: status, summary, and
perfdata per pair (per primary).

`REPLAG CRITICAL - 1 of 2 replicas unreachable: … | 'us-east>eu-west-1 p99'=81.5ms;200;;0 …`
Exit codes are Nagios's: 0 OK, 1 WARNING (unused), 2 CRITICAL (a breach, or a replica
that could not be measured; a failover that would lose more than allowed), 3 UNKNOWN
(the command itself failed: config, write endpoint, a primary that cannot be read).
"""

from __future__ import annotations

from replag.probes.report import ProbeReport
from replag.replication.check import FailoverCheck

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATUS = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}


def _label(text: str) -> str:
    # Nagios perfdata labels may not hold quotes or '='.
    return "'" + text.replace("'", "").replace("=", "_") + "'"


def _number(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def nagios_line(report: ProbeReport, *, max_p99_ms: float | None, max_loss: float | None) -> str:
    """The one line a plugin prints (status, what is wrong, perfdata)."""
    code = nagios_code(report)
    pairs = len(report.pairs)
    if report.unreachable:
        summary = f"{len(report.unreachable)} unreachable: " + "; ".join(
            f"{u['replica']}: {u['error']}" for u in report.unreachable
        )
    elif report.breaches:
        summary = "; ".join(b["message"] for b in report.breaches)
    else:
        worst = max((p.summary.lag_ms["p99"] or 0.0 for p in report.pairs), default=0.0)
        noun = "replica" if pairs == 1 else "replicas"
        summary = f"{pairs} {noun} within limits, worst p99 {_number(worst)} ms"
    perf = []
    unreachable = {u["replica"] for u in report.unreachable}
    warn_p99 = _number(max_p99_ms) if max_p99_ms is not None else ""
    crit_loss = _number(100 * max_loss) if max_loss is not None else ""
    for pair in report.pairs:
        s = pair.summary
        name = f"{s.source}>{s.replica}"
        if s.lag_ms["p99"] is not None:
            perf.append(f"{_label(name + ' p99')}={_number(s.lag_ms['p99'])}ms;;{warn_p99};0;")
        # Nothing sent or read there (an unreachable replica): the loss is not known, which
        # Nagios writes U; 0% would graph as a healthy replica.
        measured = s.sent and s.replica not in unreachable
        loss = _number(100 * s.loss_ratio) + "%" if measured else "U"
        perf.append(f"{_label(name + ' lost')}={loss};;{crit_loss};0;100")
    line = f"REPLAG {STATUS[code]} - {summary}".replace("|", "/").replace("\n", " ")
    return line + (" | " + " ".join(perf) if perf else "")


def nagios_code(report: ProbeReport) -> int:
    return CRITICAL if report.unreachable or report.breaches else OK


def failover_nagios_line(result: FailoverCheck) -> str:
    """`failover-check --format nagios`: OK when every primary has a safe candidate, else
    CRITICAL naming the unsafe ones; perfdata: each primary's safest RPO in bytes (and
    seconds, where known) against --max-bytes (--max-lag)."""
    code = OK if result.safe else CRITICAL
    unsafe = [a for a in result.assessments if not a.safe]
    verdicts = "; ".join(f"{a.source}: {a.verdict}" for a in unsafe or result.assessments)
    count = len(result.assessments)
    noun = "primary" if count == 1 else "primaries"
    summary = verdicts if unsafe else f"{count} {noun} safe to fail over: {verdicts}"
    perf = []
    for a in result.assessments:
        safest = a.safest
        if safest is None:
            continue
        if safest.rpo_bytes is not None:
            perf.append(f"{_label(a.source + ' rpo')}={safest.rpo_bytes}B;;{a.max_bytes};0;")
        if safest.rpo_s is not None:
            limit = _number(a.max_lag_s) if a.max_lag_s is not None else ""
            perf.append(f"{_label(a.source + ' rpo_s')}={_number(safest.rpo_s)}s;;{limit};0;")
    line = f"REPLAG {STATUS[code]} - {summary}".replace("|", "/").replace("\n", " ")
    return line + (" | " + " ".join(perf) if perf else "")


def failover_nagios_code(result: FailoverCheck) -> int:
    return OK if result.safe else CRITICAL


def nagios_error(message: str) -> str:
    return f"REPLAG UNKNOWN - {message}".replace("|", "/").replace("\n", " ")
