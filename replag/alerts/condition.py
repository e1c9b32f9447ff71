"""What a rule says about one subject now (`Condition`), and what every rule kind may read
(`RuleContext`); the kinds themselves are in `replag.alerts.rules` and
`replag.alerts.replication_rules`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from replag.alerts.config import AlertRule
from replag.config import Config
from replag.lagindex import LagIndex
from replag.store import Store


@dataclass(frozen=True, kw_only=True)
class Condition:
    """One rule on one subject now: `active`, or not, or (`no_data`) not measurable."""

    rule: AlertRule
    labels: dict[str, str] = field(default_factory=dict)
    active: bool
    value: float | None
    summary: str
    no_data: bool = False

    @property
    def all_labels(self) -> dict[str, str]:
        return {
            "alertname": self.rule.name,
            "kind": self.rule.kind,
            "severity": self.rule.severity,
            **self.labels,
        }

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.rule.name, self.labels)


def fingerprint(rule_name: str, labels: dict[str, str]) -> str:
    text = json.dumps([rule_name, sorted(labels.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class RuleContext:
    """What every rule kind may read: the config, the lag index (and its store), the time."""

    config: Config
    index: LagIndex
    now_ns: int

    @property
    def store(self) -> Store:
        return self.index.store

    def since_ns(self, rule: AlertRule) -> int:
        return self.now_ns - int(rule.over_s * 1e9)


RuleKind = Callable[[AlertRule, RuleContext], list[Condition]]
