"""What the latest check said of each replica, read from the store's repair runs.

Every finished `repair check` and `repair run` (from the CLI, cron or `serve`) leaves
its report in `repair_runs`; its per-replica counts say how many keys that replica
held differently from its group's truth. A check's verdict is what it found; a
repair's is what it left. A failover must never promote a replica the latest run
found divergent, and health names it. A group whose latest run left keys it could not
compare (`not_compared`: module types without a digest) is not known to be clean, and
health names that too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from replag.plural import count
from replag.store import Store

# Runs read, newest first, to find each replica's latest verdict.
_RUNS_READ = 50


@dataclass(frozen=True, kw_only=True)
class CheckVerdict:
    """One replica in the latest finished check or repair run that compared it."""

    replica: str
    group: str
    run_id: str
    kind: str  # check | repair
    finished_ns: int
    divergent: int  # a check: keys found divergent there; a repair: keys left divergent
    # A group's run (`replica` ""): keys whose values it could not compare, by type.
    not_compared: tuple[tuple[str, int], ...] = ()

    def age_s(self, now_ns: int) -> float:
        return max(0.0, (now_ns - self.finished_ns) / 1e9)

    def to_dict(self, *, now_ns: int) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "kind": self.kind,
            "group": self.group,
            "age_s": round(self.age_s(now_ns), 1),
            "divergent_keys": self.divergent,
        }

    def describe(self, *, now_ns: int) -> str:
        """`check check-… 12 s ago: 30 divergent keys`."""
        what = "left" if self.kind == "repair" else "found"
        return (
            f"{self.kind} {self.run_id} {self.age_text(now_ns)} ago {what} "
            f"{self.divergent} divergent key{'' if self.divergent == 1 else 's'}"
        )

    def age_text(self, now_ns: int) -> str:
        return _age(self.age_s(now_ns))

    def not_compared_text(self) -> str:
        """`3 keys not compared (graphdata: 2, ReJSON-RL: 1)`, "" for none."""
        total = sum(n for _, n in self.not_compared)
        if not total:
            return ""
        types = ", ".join(f"{t}: {n}" for t, n in self.not_compared)
        return f"{count(total, 'key')} not compared ({types})"


def _not_compared(group: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    rows = group.get("not_compared") or ()
    counts: dict[str, int] = {}
    for row in rows:
        if isinstance(row, dict) and int(row.get("keys", 0) or 0) > 0:
            name = str(row.get("type", "?"))
            counts[name] = counts.get(name, 0) + int(row["keys"])
    return tuple(sorted(counts.items()))


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _replica_divergent(kind: str, counts: dict[str, Any]) -> int:
    if kind == "repair":
        return int(counts.get("leave", 0) or 0)
    return sum(int(counts.get(k, 0) or 0) for k in ("missing", "extra", "different"))


class VerdictCache:
    """`latest_verdicts` (and the groups'), read again only when a run finished since (one
    small query otherwise): the service asks at every sample and every API call."""

    def __init__(self) -> None:
        self._seen: tuple[Any, ...] | None = None
        self._verdicts: dict[str, CheckVerdict] = {}
        self._groups: dict[str, CheckVerdict] = {}

    def groups(self, store: Store) -> dict[str, CheckVerdict]:
        self.get(store)
        return self._groups

    def get(self, store: Store) -> dict[str, CheckVerdict]:
        row = store.execute(
            "SELECT COUNT(*) AS n, MAX(finished_ns) AS newest FROM repair_runs "
            "WHERE status = 'done'",
            last_known=True,
        )
        seen = (row[0].n, row[0].newest) if row else None
        if seen is None or seen != self._seen:
            self._verdicts, self._groups = _latest(store)
            self._seen = seen
        return self._verdicts


def latest_verdicts(store: Store) -> dict[str, CheckVerdict]:
    """Per replica name, the verdict of the newest finished (done) check or repair run whose
    report compared it; dry runs count as checks."""
    return _latest(store)[0]


def latest_group_verdicts(store: Store) -> dict[str, CheckVerdict]:
    """Per group, the newest finished check or repair run that compared it (`replica` is
    "": the group's whole count, keys found by a check, left by a repair)."""
    return _latest(store)[1]


def _latest(store: Store) -> tuple[dict[str, CheckVerdict], dict[str, CheckVerdict]]:
    rows = store.execute(
        "SELECT run_id, kind, finished_ns, params_json, report_json FROM repair_runs "
        "WHERE status = 'done' AND kind IN ('check', 'repair') AND report_json IS NOT NULL "
        "ORDER BY finished_ns DESC, run_id DESC LIMIT ?",
        (_RUNS_READ,),
        last_known=True,
    )
    verdicts: dict[str, CheckVerdict] = {}
    groups: dict[str, CheckVerdict] = {}
    for row in rows:
        try:
            report = json.loads(row.report_json)
            dry = bool(json.loads(row.params_json).get("dry_run"))
        except (TypeError, ValueError):
            continue  # a report this version cannot read says nothing
        kind = "check" if row.kind == "check" or dry else "repair"
        for group in report.get("groups") or ():
            per_replica = group.get("per_replica") or {}
            name = str(group.get("group"))
            if name not in groups:
                found = int(group.get("divergent", 0) or 0)
                left = sum(
                    _replica_divergent(kind, c) for c in per_replica.values() if isinstance(c, dict)
                )
                groups[name] = CheckVerdict(
                    replica="",
                    group=name,
                    run_id=str(row.run_id),
                    kind=kind,
                    finished_ns=int(row.finished_ns or 0),
                    divergent=found if kind == "check" else min(found, left),
                    not_compared=_not_compared(group),
                )
            for replica, counts in per_replica.items():
                if replica in verdicts or not isinstance(counts, dict):
                    continue
                verdicts[replica] = CheckVerdict(
                    replica=replica,
                    group=str(group.get("group")),
                    run_id=str(row.run_id),
                    kind=kind,
                    finished_ns=int(row.finished_ns or 0),
                    divergent=_replica_divergent(kind, counts),
                )
    return verdicts, groups
