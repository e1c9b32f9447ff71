"""The `[alerts]` table of the config file: alert rules and the sinks they notify.

    [alerts]
    repeat_interval = "4h"        # re-notify an alert still firing after this long
    send_resolved = true

    [[alerts.rules]]
    name = "cross-region-lag"
    kind = "lag_p99"              # lag_p99 | probe_loss | divergent_keys | unreachable | no_probe
                                  # | dynomite_dropped_writes | replication_bytes_behind
                                  # | replication_headroom | replication_link_down
                                  # | replication_full_resync | failover_rpo_bytes
                                  # | failover_rpo_time
    threshold = "200ms"           # lag_p99: duration; probe_loss: ratio; divergent_keys: count;
                                  # no_probe: duration without a successful probe;
                                  # dynomite_dropped_writes: dropped peer requests;
                                  # replication_bytes_behind, failover_rpo_bytes: a size
                                  # ("1mb"); replication_headroom: a fraction it must stay
                                  # above; replication_link_down: how long down;
                                  # replication_full_resync: full resyncs within `over`;
                                  # failover_rpo_time: a duration
    for = "5m"                    # the condition must hold this long before firing
    over = "5m"                   # lag_p99 / probe_loss: the range of windows merged;
                                  # dynomite_dropped_writes: how far back growth counts
    severity = "critical"         # critical | warning | info
    source = "us-east"            # optional filters: source, target (regions), group
    target = "eu-west"
    no_data = "keep_firing"       # when the rule has nothing to judge (every probe lost, no
                                  # probe sent, the check failed, the node silent):
                                  # keep_firing: the alert stays as it is (default; a partition
                                  #   never resolves it); nodata: it moves to a "nodata" state
                                  #   that sinks and the dashboard show; ok: counts as healthy

    [[alerts.sinks]]
    name = "ops"
    kind = "webhook"              # webhook | slack | pagerduty | command
    url = "https://hooks.example/replag"
    secret_env = "REPLAG_HOOK_SECRET"   # or secret = "…": HMAC-SHA256 signature header

Errors name the file and the key, as everywhere else in the config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from replag.durations import parse_bytes, parse_duration_s
from replag.errors import ConfigError

RuleKind = Literal[
    "lag_p99",
    "probe_loss",
    "divergent_keys",
    "unreachable",
    "no_probe",
    "dynomite_dropped_writes",
    "replication_bytes_behind",
    "replication_headroom",
    "replication_link_down",
    "replication_full_resync",
    "failover_rpo_bytes",
    "failover_rpo_time",
]
SinkKind = Literal["webhook", "slack", "pagerduty", "command"]
Severity = Literal["critical", "warning", "info"]
NoData = Literal["keep_firing", "nodata", "ok"]

RULE_KINDS: tuple[RuleKind, ...] = (
    "lag_p99",
    "probe_loss",
    "divergent_keys",
    "unreachable",
    "no_probe",
    "dynomite_dropped_writes",
    "replication_bytes_behind",
    "replication_headroom",
    "replication_link_down",
    "replication_full_resync",
    "failover_rpo_bytes",
    "failover_rpo_time",
)
SINK_KINDS: tuple[SinkKind, ...] = ("webhook", "slack", "pagerduty", "command")
SEVERITIES: tuple[Severity, ...] = ("critical", "warning", "info")
NO_DATA_MODES: tuple[NoData, ...] = ("keep_firing", "nodata", "ok")
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"

_ALERTS_KEYS = {"rules", "sinks", "repeat_interval", "send_resolved"}
_RULE_KEYS = {
    "name",
    "kind",
    "threshold",
    "for",
    "over",
    "severity",
    "source",
    "target",
    "group",
    "no_data",
}
_SINK_KEYS = {
    "name",
    "kind",
    "url",
    "secret",
    "secret_env",
    "routing_key",
    "routing_key_env",
    "command",
    "timeout",
    "retries",
    "backoff",
    "max_backoff",
}
# Thresholds used when a rule omits one.
_DEFAULT_THRESHOLD: dict[RuleKind, float] = {
    "lag_p99": 500.0,
    "probe_loss": 0.01,
    "divergent_keys": 0.0,
    "unreachable": 0.0,
    "no_probe": 300.0,
    "dynomite_dropped_writes": 0.0,
    "replication_bytes_behind": float(1 << 20),
    "replication_headroom": 0.25,
    "replication_link_down": 0.0,
    "replication_full_resync": 0.0,
    "failover_rpo_bytes": float(1 << 20),
    "failover_rpo_time": 1.0,
}
_BYTES_KINDS = ("replication_bytes_behind", "failover_rpo_bytes")
_SECONDS_KINDS = ("no_probe", "replication_link_down", "failover_rpo_time")


@dataclass(frozen=True, kw_only=True)
class AlertRule:
    """One rule; `threshold` is in ms (lag_p99), a ratio (probe_loss), keys
    (divergent_keys), seconds (no_probe) or dropped peer requests within `over`
    (dynomite_dropped_writes). `no_data` says what an evaluation with nothing to judge
    does to the alert (see the module docstring)."""

    name: str
    kind: RuleKind
    threshold: float
    for_s: float = 0.0
    over_s: float = 300.0
    severity: Severity = "warning"
    source: str | None = None
    target: str | None = None
    group: str | None = None
    no_data: NoData = "keep_firing"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "threshold": self.threshold,
            "for_s": self.for_s,
            "over_s": self.over_s,
            "severity": self.severity,
            "source": self.source,
            "target": self.target,
            "group": self.group,
            "no_data": self.no_data,
        }


@dataclass(frozen=True, kw_only=True)
class AlertSink:
    """Where notifications go. Secrets stay out of repr() and to_dict()."""

    name: str
    kind: SinkKind
    url: str | None = field(default=None, repr=False)  # a Slack URL is a credential
    secret: str | None = field(default=None, repr=False)
    routing_key: str | None = field(default=None, repr=False)
    command: tuple[str, ...] = ()
    timeout_s: float = 5.0
    retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    @property
    def secrets(self) -> tuple[str, ...]:
        """Strings that must never be shown (a Slack webhook URL is itself a credential)."""
        values = [self.secret, self.routing_key]
        if self.kind == "slack":
            values.append(self.url)
        return tuple(v for v in values if v)

    def target_description(self) -> str:
        """Where the sink sends, safe to show: scheme://host[:port] only for URLs."""
        if self.kind == "command":
            return self.command[0]
        parts = urlsplit(self.url or "")
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "target": self.target_description(),
            "signed": bool(self.secret),
            "timeout_s": self.timeout_s,
            "retries": self.retries,
        }


@dataclass(frozen=True, kw_only=True)
class AlertsConfig:
    rules: tuple[AlertRule, ...] = ()
    sinks: tuple[AlertSink, ...] = ()
    repeat_interval_s: float = 4 * 3600.0
    send_resolved: bool = True


def parse_alerts(raw: Any, *, where: str, environ: Mapping[str, str]) -> AlertsConfig:
    """Validate the `[alerts]` table; raise ConfigError naming file and key."""
    if not isinstance(raw, dict):
        raise ConfigError("[alerts] must be a table", where=f"{where}: alerts")
    _no_unknown(raw, _ALERTS_KEYS, where=f"{where}: alerts")
    repeat = _duration(raw.get("repeat_interval", "4h"), where=f"{where}: alerts.repeat_interval")
    send_resolved = raw.get("send_resolved", True)
    if not isinstance(send_resolved, bool):
        raise ConfigError("expected true or false", where=f"{where}: alerts.send_resolved")
    rules = tuple(
        _rule(r, where=f"{where}: alerts.rules[{i}]")
        for i, r in enumerate(_tables(raw.get("rules", []), where=f"{where}: alerts.rules"))
    )
    sinks = tuple(
        _sink(s, where=f"{where}: alerts.sinks[{i}]", environ=environ)
        for i, s in enumerate(_tables(raw.get("sinks", []), where=f"{where}: alerts.sinks"))
    )
    for items, what in ((rules, "rule"), (sinks, "sink")):
        names = [item.name for item in items]
        for name in names:
            if names.count(name) > 1:
                raise ConfigError(f"duplicate {what} name {name!r}", where=f"{where}: alerts")
    return AlertsConfig(
        rules=rules, sinks=sinks, repeat_interval_s=repeat, send_resolved=send_resolved
    )


def _rule(raw: dict[str, Any], *, where: str) -> AlertRule:
    _no_unknown(raw, _RULE_KEYS, where=where)
    name = _name(raw, where=where)
    kind = raw.get("kind")
    if kind not in RULE_KINDS:
        raise ConfigError(
            f"expected one of {', '.join(RULE_KINDS)}, got {kind!r}", where=f"{where}.kind"
        )
    severity = raw.get("severity", "warning")
    if severity not in SEVERITIES:
        raise ConfigError(
            f"expected one of {', '.join(SEVERITIES)}, got {severity!r}", where=f"{where}.severity"
        )
    threshold = _threshold(kind, raw.get("threshold"), where=f"{where}.threshold")
    filters = {}
    for key in ("source", "target", "group"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError("expected a non-empty string", where=f"{where}.{key}")
        filters[key] = value
    over = _duration(raw.get("over", "5m"), where=f"{where}.over")
    if over <= 0:
        raise ConfigError("must be longer than 0s", where=f"{where}.over")
    no_data = raw.get("no_data", "keep_firing")
    if no_data not in NO_DATA_MODES:
        raise ConfigError(
            f"expected one of {', '.join(NO_DATA_MODES)}, got {no_data!r}",
            where=f"{where}.no_data",
        )
    return AlertRule(
        name=name,
        kind=kind,
        threshold=threshold,
        for_s=_duration(raw.get("for", "0s"), where=f"{where}.for"),
        over_s=over,
        severity=severity,
        no_data=no_data,
        **filters,
    )


def _threshold(kind: RuleKind, raw: Any, *, where: str) -> float:
    if raw is None:
        return _DEFAULT_THRESHOLD[kind]
    if kind == "lag_p99":
        return _duration(raw, where=where) * 1000
    if kind in _SECONDS_KINDS:
        return _duration(raw, where=where)
    if kind in _BYTES_KINDS:
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        try:
            return float(parse_bytes(raw))
        except (AttributeError, TypeError, ValueError):
            raise ConfigError(
                f"expected a size like 1mb or a byte count, got {raw!r}", where=where
            ) from None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 <= raw < math.inf:
        raise ConfigError(f"expected a finite, non-negative number, got {raw!r}", where=where)
    if kind in ("probe_loss", "replication_headroom") and raw > 1:
        raise ConfigError(f"a ratio is between 0 and 1, got {raw!r}", where=where)
    return float(raw)


def _sink(raw: dict[str, Any], *, where: str, environ: Mapping[str, str]) -> AlertSink:
    _no_unknown(raw, _SINK_KEYS, where=where)
    name = _name(raw, where=where)
    kind = raw.get("kind")
    if kind not in SINK_KINDS:
        raise ConfigError(
            f"expected one of {', '.join(SINK_KINDS)}, got {kind!r}", where=f"{where}.kind"
        )
    secret = _secret(raw, "secret", where=where, environ=environ)
    routing_key = _secret(raw, "routing_key", where=where, environ=environ)
    url = raw.get("url", PAGERDUTY_URL if kind == "pagerduty" else None)
    command: tuple[str, ...] = ()
    if kind == "command":
        value = raw.get("command")
        if isinstance(value, str):
            value = [value]
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, str) and v for v in value)
        ):
            raise ConfigError(
                'expected a program and its arguments, e.g. ["/usr/bin/page"]',
                where=f"{where}.command",
            )
        command = tuple(value)
    else:
        if (
            not isinstance(url, str)
            or urlsplit(url).scheme not in ("http", "https")
            or not (urlsplit(url).hostname)
        ):
            raise ConfigError("expected an http:// or https:// URL", where=f"{where}.url")
    if kind == "pagerduty" and not routing_key:
        raise ConfigError("a pagerduty sink needs routing_key or routing_key_env", where=where)
    retries = raw.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 20:
        raise ConfigError(f"expected an integer 0–20, got {retries!r}", where=f"{where}.retries")
    timeout = _duration(raw.get("timeout", "5s"), where=f"{where}.timeout")
    if timeout <= 0:
        raise ConfigError("must be longer than 0s", where=f"{where}.timeout")
    return AlertSink(
        name=name,
        kind=kind,
        url=url if kind != "command" else None,
        secret=secret,
        routing_key=routing_key,
        command=command,
        timeout_s=timeout,
        retries=retries,
        backoff_s=_duration(raw.get("backoff", "500ms"), where=f"{where}.backoff"),
        max_backoff_s=_duration(raw.get("max_backoff", "30s"), where=f"{where}.max_backoff"),
    )


def _secret(
    raw: Mapping[str, Any], key: str, *, where: str, environ: Mapping[str, str]
) -> str | None:
    if key in raw and f"{key}_env" in raw:
        raise ConfigError(f"give {key} or {key}_env, not both", where=f"{where}.{key}")
    if f"{key}_env" in raw:
        var = raw[f"{key}_env"]
        if not isinstance(var, str) or var not in environ:
            raise ConfigError(f"environment variable {var} is not set", where=f"{where}.{key}_env")
        return environ[var]
    value = raw.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        # Never echo the value: it is a secret.
        raise ConfigError("expected a non-empty string", where=f"{where}.{key}")
    return value


def _name(raw: Mapping[str, Any], *, where: str) -> str:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError("missing name", where=f"{where}.name")
    return name


def _tables(raw: Any, *, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise ConfigError("must be an array of tables", where=where)
    return raw


def _duration(raw: Any, *, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ConfigError(f"expected a duration like 5m, got {raw!r}", where=where)
    try:
        return parse_duration_s(raw)
    except ValueError as exc:
        raise ConfigError(str(exc), where=where) from None


def _no_unknown(raw: Mapping[str, Any], known: set[str], *, where: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r} (expected {', '.join(sorted(known))})", where=where
        )
