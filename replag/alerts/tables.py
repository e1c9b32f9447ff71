"""The `[alerts]` table as the file writes it: `[[alerts.rules]]` and `[[alerts.sinks]]`.

Shapes and checks only; what the rest of replag uses are the values they build
(`AlertRule`, `AlertSink`, `AlertsConfig` in `alerts.config`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, ClassVar
from urllib.parse import urlsplit

import msgspec

from replag.alerts.config import (
    PAGERDUTY_URL,
    AlertRule,
    AlertsConfig,
    AlertSink,
    NoData,
    RuleKind,
    Severity,
    SinkKind,
)
from replag.durations import parse_bytes, parse_duration_s
from replag.validation import AtKey, EnvVar, FileTable, NonEmptyStr, PositiveSeconds, Seconds

# Thresholds used when a rule omits one, in the unit AlertRule.threshold holds.
DEFAULT_THRESHOLD: dict[RuleKind, float] = {
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
_RATIO_KINDS = ("probe_loss", "replication_headroom")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def threshold_in_unit(kind: RuleKind, raw: int | float | str) -> float:
    """A rule's `threshold` as written (a duration, a size, a ratio, a count) in the unit
    `AlertRule.threshold` holds for `kind`; ValueError saying what was expected."""
    if kind == "lag_p99":
        return parse_duration_s(raw) * 1000
    if kind in _SECONDS_KINDS:
        return parse_duration_s(raw)
    if kind in _BYTES_KINDS:
        size = int(raw) if isinstance(raw, float) and raw.is_integer() else raw
        try:
            if isinstance(size, float):
                raise ValueError("a byte count is whole")
            return float(parse_bytes(size))
        except ValueError:
            raise ValueError(f"expected a size like 1mb or a byte count, got {raw!r}") from None
    if not isinstance(raw, int | float) or not 0 <= raw < math.inf:
        raise ValueError(f"expected a finite, non-negative number, got {raw!r}")
    if kind in _RATIO_KINDS and raw > 1:
        raise ValueError(f"a ratio is between 0 and 1, got {raw!r}")
    return float(raw)


class RuleTable(FileTable, frozen=True, kw_only=True):
    """One `[[alerts.rules]]` table; `threshold` is written in the rule kind's unit."""

    noun: ClassVar[str] = "rule"
    name: NonEmptyStr
    kind: RuleKind
    threshold: int | float | str | None = None
    for_: Seconds = msgspec.field(default=Seconds(0.0), name="for")
    over: PositiveSeconds = PositiveSeconds(300.0)
    severity: Severity = "warning"
    source: NonEmptyStr | None = None
    target: NonEmptyStr | None = None
    replica: NonEmptyStr | None = None
    group: NonEmptyStr | None = None
    no_data: NoData = "keep_firing"

    def __post_init__(self) -> None:
        self.threshold_value()

    def threshold_value(self) -> float:
        if self.threshold is None:
            return DEFAULT_THRESHOLD[self.kind]
        try:
            return threshold_in_unit(self.kind, self.threshold)
        except ValueError as exc:
            raise AtKey(("threshold",), str(exc)) from None

    def rule(self) -> AlertRule:
        return AlertRule(
            name=self.name,
            kind=self.kind,
            threshold=self.threshold_value(),
            for_s=float(self.for_),
            over_s=float(self.over),
            severity=self.severity,
            source=self.source,
            target=self.target,
            replica=self.replica,
            group=self.group,
            no_data=self.no_data,
        )


class SinkTable(FileTable, frozen=True, kw_only=True):
    """One `[[alerts.sinks]]` table. A secret is given inline or as an environment
    variable's name (`secret_env`); errors never echo a secret's value."""

    noun: ClassVar[str] = "sink"
    name: NonEmptyStr
    kind: SinkKind
    url: str | None = None
    secret: NonEmptyStr | None = None
    secret_env: EnvVar | None = None
    routing_key: NonEmptyStr | None = None
    routing_key_env: EnvVar | None = None
    command: NonEmptyStr | list[NonEmptyStr] | None = None
    timeout: PositiveSeconds = PositiveSeconds(5.0)
    retries: Annotated[int, msgspec.Meta(ge=0, le=20)] = 3
    backoff: Seconds = Seconds(0.5)
    max_backoff: Seconds = Seconds(30.0)
    # kind = "alertmanager" only:
    urls: list[str] | None = None
    resend: PositiveSeconds = PositiveSeconds(60.0)
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    bearer_token: NonEmptyStr | None = None
    bearer_token_env: EnvVar | None = None
    basic_user: NonEmptyStr | None = None
    basic_password: NonEmptyStr | None = None
    basic_password_env: EnvVar | None = None
    ca_file: NonEmptyStr | None = None
    cert_file: NonEmptyStr | None = None
    key_file: NonEmptyStr | None = None

    _ALERTMANAGER_ONLY: ClassVar[tuple[str, ...]] = (
        "urls", "bearer_token", "bearer_token_env", "basic_user", "basic_password",
        "basic_password_env", "ca_file", "cert_file", "key_file",
    )  # fmt: skip

    def __post_init__(self) -> None:
        for key in ("secret", "routing_key", "bearer_token", "basic_password"):
            if getattr(self, key) is not None and getattr(self, f"{key}_env") is not None:
                raise AtKey((key,), f"give {key} or {key}_env, not both")
        if self.kind == "command":
            if not self.command:
                raise AtKey(
                    ("command",), 'expected a program and its arguments, e.g. ["/usr/bin/page"]'
                )
        elif self.kind == "alertmanager":
            self._check_alertmanager()
        else:
            url = urlsplit(self.url or (PAGERDUTY_URL if self.kind == "pagerduty" else ""))
            if url.scheme not in ("http", "https") or not url.hostname:
                raise AtKey(("url",), "expected an http:// or https:// URL")
        if self.kind != "alertmanager":
            for key in self._ALERTMANAGER_ONLY:
                if getattr(self, key) is not None:
                    raise AtKey((key,), "only an alertmanager sink takes it")
        if self.kind == "pagerduty" and not (self.routing_key or self.routing_key_env):
            raise ValueError("a pagerduty sink needs routing_key or routing_key_env")

    def _check_alertmanager(self) -> None:
        if (self.url is None) == (self.urls is None):
            raise AtKey(("urls",), "give url or urls (every Alertmanager of the cluster)")
        urls = self.urls if self.urls is not None else [self.url or ""]
        if not urls:
            raise AtKey(("urls",), "expected at least one Alertmanager URL")
        for i, raw in enumerate(urls):
            url = urlsplit(raw)
            if url.scheme not in ("http", "https") or not url.hostname:
                where = ("urls", i) if self.urls is not None else ("url",)
                raise AtKey(where, "expected an http:// or https:// URL")
        for name, value in self.labels.items():
            if not _LABEL_NAME.fullmatch(name):
                raise AtKey(("labels", name), "a label name is [a-zA-Z_][a-zA-Z0-9_]*")
            if not value:
                raise AtKey(("labels", name), "a label value is not empty")
        if (self.bearer_token or self.bearer_token_env) and self.basic_user:
            raise AtKey(("bearer_token",), "give a bearer token or basic auth, not both")
        if bool(self.basic_user) != bool(self.basic_password or self.basic_password_env):
            raise AtKey(("basic_user",), "basic auth takes basic_user and basic_password")
        if bool(self.cert_file) != bool(self.key_file):
            raise AtKey(("cert_file",), "a client certificate takes cert_file and key_file")

    def sink(self, environ: Mapping[str, str]) -> AlertSink:
        def secret(value: str | None, var: EnvVar | None) -> str | None:
            return environ[var] if var is not None else value

        if self.kind == "alertmanager":
            urls = tuple(self.urls if self.urls is not None else [self.url or ""])
            return AlertSink(
                name=self.name,
                kind=self.kind,
                url=urls[0],
                urls=urls,
                resend_s=float(self.resend),
                labels=tuple(sorted(self.labels.items())),
                bearer_token=secret(self.bearer_token, self.bearer_token_env),
                basic_user=self.basic_user,
                basic_password=secret(self.basic_password, self.basic_password_env),
                ca_file=self.ca_file,
                cert_file=self.cert_file,
                key_file=self.key_file,
                timeout_s=float(self.timeout),
                retries=self.retries,
                backoff_s=float(self.backoff),
                max_backoff_s=float(self.max_backoff),
            )

        command = [self.command] if isinstance(self.command, str) else self.command or []
        return AlertSink(
            name=self.name,
            kind=self.kind,
            url=None if self.kind == "command" else self.url or PAGERDUTY_URL,
            secret=secret(self.secret, self.secret_env),
            routing_key=secret(self.routing_key, self.routing_key_env),
            command=tuple(command) if self.kind == "command" else (),
            timeout_s=float(self.timeout),
            retries=self.retries,
            backoff_s=float(self.backoff),
            max_backoff_s=float(self.max_backoff),
        )


class AlertsTable(FileTable, frozen=True, kw_only=True):
    """The `[alerts]` table."""

    rules: list[RuleTable] = msgspec.field(default_factory=list)
    sinks: list[SinkTable] = msgspec.field(default_factory=list)
    repeat_interval: Seconds = Seconds(4 * 3600.0)
    send_resolved: bool = True

    def __post_init__(self) -> None:
        for items, what in ((self.rules, "rule"), (self.sinks, "sink")):
            names = [item.name for item in items]
            for name in names:
                if names.count(name) > 1:
                    raise ValueError(f"duplicate {what} name {name!r}")

    def alerts(self, environ: Mapping[str, str]) -> AlertsConfig:
        return AlertsConfig(
            rules=tuple(r.rule() for r in self.rules),
            sinks=tuple(s.sink(environ) for s in self.sinks),
            repeat_interval_s=float(self.repeat_interval),
            send_resolved=self.send_resolved,
        )
