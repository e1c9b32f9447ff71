"""The bodies each kind of sink receives for a batch of alert events.

The generic webhook (and the command hook's stdin) get Alertmanager's webhook
payload (version 4), so receivers written for Alertmanager work unchanged;
Slack gets an incoming-webhook message; PagerDuty one Events v2 event per alert,
deduplicated by the alert's fingerprint; Alertmanager itself the list of alerts its
API (`POST /api/v2/alerts`) takes, as Prometheus posts them.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from replag.alerts.state import AlertEvent

SIGNATURE_HEADER = "X-Replag-Signature"
_ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "not ended"
_SLACK_COLOURS = {"critical": "#d93025", "warning": "#f29900", "info": "#1a73e8"}
_SLACK_STATE_COLOURS = {"resolved": "#1e8e3e", "nodata": "#7b61ff"}
_SLACK_STATE = {"firing": "FIRING", "nodata": "NO DATA", "resolved": "RESOLVED"}
_PAGERDUTY_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


def iso(ns: int | None) -> str:
    if ns is None:
        return _ZERO_TIME
    return (
        datetime.fromtimestamp(ns / 1e9, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def alertmanager(
    events: Sequence[AlertEvent], *, receiver: str, external_url: str = ""
) -> dict[str, Any]:
    """Alertmanager's webhook body (version 4) for `events`."""
    alerts = [
        {
            "status": e.status,
            "labels": e.labels,
            "annotations": {
                "summary": e.summary,
                "state": e.state,
                **({"value": f"{e.value:g}"} if e.value is not None else {}),
                **({"duration": f"{e.duration_s:g}s"} if e.duration_s is not None else {}),
            },
            "startsAt": iso(e.starts_ns),
            "endsAt": iso(e.ends_ns),
            "generatorURL": f"{external_url}/#alerts" if external_url else "",
            "fingerprint": e.fingerprint,
            # An idempotency key: a copy sent again after a failover has the same.
            "notificationId": e.notification_id,
        }
        for e in events
    ]
    common = _common(e.labels for e in events)
    return {
        "version": "4",
        "groupKey": "{}:" + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(common.items())) + "}",
        "truncatedAlerts": 0,
        "status": "firing" if any(e.status == "firing" for e in events) else "resolved",
        "receiver": receiver,
        "groupLabels": {k: v for k, v in common.items() if k == "alertname"},
        "commonLabels": common,
        "commonAnnotations": {},
        "externalURL": external_url,
        "alerts": alerts,
    }


def alertmanager_api(
    events: Sequence[AlertEvent],
    *,
    labels: Sequence[tuple[str, str]] = (),
    external_url: str = "",
    now_ns: int,
    valid_s: float,
) -> list[dict[str, Any]]:
    """The body of `POST /api/v2/alerts` for `events`: a firing alert's `endsAt` is
    `valid_s` from `now_ns` (posted again before then while it fires, it lapses by itself
    if replag stops), a resolved one's when it resolved."""
    out = []
    for e in events:
        alert_labels = {"alertname": e.rule, **e.labels, **dict(labels)}
        annotations = {"summary": e.summary, "state": e.state}
        if e.value is not None:
            annotations["value"] = f"{e.value:g}"
        if e.duration_s is not None:
            annotations["duration"] = f"{e.duration_s:g}s"
        ends_ns = e.ends_ns if e.status == "resolved" else now_ns + int(valid_s * 1e9)
        alert: dict[str, Any] = {
            # Alertmanager reads an empty label as no label, and refuses some: drop them.
            "labels": {k: str(v) for k, v in alert_labels.items() if v not in (None, "")},
            "annotations": annotations,
            "startsAt": iso(e.starts_ns),
            "endsAt": iso(ends_ns),
        }
        if external_url:
            alert["generatorURL"] = f"{external_url}/#alerts"
        out.append(alert)
    return out


def _common(label_sets: Any) -> dict[str, str]:
    sets = list(label_sets)
    if not sets:
        return {}
    first = dict(sets[0])
    return {k: v for k, v in first.items() if all(s.get(k) == v for s in sets[1:])}


def signature(secret: str, body: bytes) -> str:
    """The value of the signature header: `sha256=` + hex HMAC-SHA256 of the exact body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def slack(events: Sequence[AlertEvent]) -> dict[str, Any]:
    """One message; each alert an attachment stamped with when it fired or resolved."""
    counts = {
        state: sum(e.state == state for e in events) for state in ("firing", "nodata", "resolved")
    }
    title = "replag: " + ", ".join(
        f"{n} {'without data' if state == 'nodata' else state}" for state, n in counts.items() if n
    )
    return {
        "text": title,
        "attachments": [
            {
                "color": _SLACK_STATE_COLOURS.get(e.state)
                or _SLACK_COLOURS.get(e.severity, "#f29900"),
                "title": f"[{_SLACK_STATE[e.state]}] {e.rule}" + (" (repeat)" if e.repeat else ""),
                "text": e.summary,
                "ts": (e.ends_ns or e.starts_ns) // 1_000_000_000,
            }
            for e in events
        ],
    }


def pagerduty(event: AlertEvent, *, routing_key: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "resolve" if event.status == "resolved" else "trigger",
        "dedup_key": f"replag-{event.fingerprint}",
    }
    if event.status == "firing":
        body["payload"] = {
            "summary": event.summary[:1024],
            "source": event.labels.get("source")
            or event.labels.get("group")
            or socket.gethostname(),
            "severity": _PAGERDUTY_SEVERITY.get(event.severity, "warning"),
            "timestamp": iso(event.starts_ns),
            "component": "replag",
            "class": event.labels.get("kind", ""),
            "custom_details": {
                "labels": event.labels,
                "value": event.value,
                "state": event.state,
            },
        }
    return body
