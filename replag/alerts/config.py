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
    source = "us-east"            # optional filters: source, target (regions), replica
    target = "eu-west"            # (a replica's name, or a Dynomite rack's), group
    replica = "eu-west-2"
    no_data = "keep_firing"       # when the rule has nothing to judge (every probe lost, no
                                  # probe sent, the check failed, the node silent):
                                  # keep_firing: the alert stays as it is (default; a partition
                                  #   never resolves it); nodata: it moves to a "nodata" state
                                  #   that sinks and the dashboard show; ok: counts as healthy

    [[alerts.sinks]]
    name = "ops"
    kind = "webhook"              # webhook | slack | pagerduty | command | alertmanager
    url = "https://hooks.example/replag"
    secret_env = "REPLAG_HOOK_SECRET"   # or secret = "…": HMAC-SHA256 signature header

    [[alerts.sinks]]
    name = "am"
    kind = "alertmanager"         # POST /api/v2/alerts to every Alertmanager (HA)
    urls = ["https://am-1:9093", "https://am-2:9093"]   # or url = "…"
    resend = "1m"                 # re-post alerts still firing this often
    labels = { team = "storage" } # added to every alert (routing)
    bearer_token_env = "AM_TOKEN" # or bearer_token; or basic_user + basic_password(_env)
    ca_file = "/etc/replag/am-ca.pem"   # TLS; cert_file + key_file: a client certificate

The values rules and sinks are read into; `alerts.tables` declares how the file
writes them. Errors name the file and the key, as everywhere else in the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

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
SinkKind = Literal["webhook", "slack", "pagerduty", "command", "alertmanager"]
Severity = Literal["critical", "warning", "info"]
NoData = Literal["keep_firing", "nodata", "ok"]

PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"


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
    replica: str | None = None
    group: str | None = None
    no_data: NoData = "keep_firing"

    def covers(self, source: str, target: str, replica: str | None = None) -> bool:
        """Whether the rule's filters let (source, target[, replica]) through."""
        return (
            self.source in (None, source)
            and self.target in (None, target)
            and self.replica in (None, replica)
        )

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
            "replica": self.replica,
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
    # kind = "alertmanager": every Alertmanager of a cluster (`url` is the first), how often
    # alerts still firing are posted again, labels added to each, auth and TLS.
    urls: tuple[str, ...] = field(default=(), repr=False)
    resend_s: float = 60.0
    labels: tuple[tuple[str, str], ...] = ()
    bearer_token: str | None = field(default=None, repr=False)
    basic_user: str | None = None
    basic_password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    @property
    def secrets(self) -> tuple[str, ...]:
        """Strings that must never be shown (a Slack webhook URL is itself a credential)."""
        values = [self.secret, self.routing_key, self.bearer_token, self.basic_password]
        for url in dict.fromkeys(u for u in (self.url, *self.urls) if u):
            # A Slack URL is a credential, and any URL may carry one (user:password@,
            # ?token=…): an error that quotes the URL (a redirect loop) must not show it.
            parts = urlsplit(url)
            bare = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
            values += [url, bare, parts.password]
            values += [value for _, value in parse_qsl(parts.query) if len(value) >= 6]
            if self.kind == "slack" and len(parts.path) > 1:
                values.append(parts.path)
        # Longest first: a URL is redacted whole before any part of it.
        return tuple(sorted({v for v in values if v}, key=len, reverse=True))

    def target_description(self) -> str:
        """Where the sink sends, safe to show: scheme://host[:port] only for URLs."""
        if self.kind == "command":
            return self.command[0]
        return ", ".join(
            f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
            for parts in map(urlsplit, self.urls or (self.url or "",))
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "target": self.target_description(),
            "signed": bool(self.secret),
            "timeout_s": self.timeout_s,
            "retries": self.retries,
        }
        if self.kind == "alertmanager":
            out["resend_s"] = self.resend_s
            out["auth"] = "bearer" if self.bearer_token else "basic" if self.basic_user else None
        return out


@dataclass(frozen=True, kw_only=True)
class AlertsConfig:
    rules: tuple[AlertRule, ...] = ()
    sinks: tuple[AlertSink, ...] = ()
    repeat_interval_s: float = 4 * 3600.0
    send_resolved: bool = True
