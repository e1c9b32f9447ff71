"""The `alertmanager` sink against a real Alertmanager (v0.35.0, REPLAG_ALERTMANAGER, built
once per machine by .ci/go-tools.sh; skipped without it): an alert shows in its API while
firing, is posted again with a later endsAt while it fires, a silence there silences it,
it is resolved after the heal, a fleet of instances makes one alert there; several
Alertmanagers (one down), TLS with basic auth, a bearer token; secrets never shown."""

from __future__ import annotations

import logging
import ssl
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from replag.alerts.config import AlertSink
from replag.alerts.evaluate import AlertEvent, AlertSender, evaluate_and_notify
from replag.alerts.health import record_probe
from replag.config import Config, config_from_dict
from replag.lagindex import LagIndex
from replag.metrics import ServiceMetrics
from replag.service.alerting import AlertEvaluation
from replag.service.leasing import LeaseKeeper
from replag.store import Store
from tests.helpers.prometheus_tools import alertmanager, binary, free_port
from tests.helpers.tls import make_pki
from tests.helpers.waiting import until

RULE = "replica-down"
DOWN = [{"region": "b", "replica": "b-1", "error": "connection refused"}]
PASSWORD = "am-test-password"
# bcrypt of PASSWORD (Alertmanager's web config takes hashes only).
PASSWORD_HASH = "$2b$04$v/pZlaJHUqIA5OyjT8.dhuqQwR9hiwx7SLMF6c.0wYjvuNY0MLptS"


class Report:
    """A probe report as `evaluate_and_notify` reads it."""

    def __init__(self, unreachable: list[dict[str, str]]) -> None:
        self.run_id = "run-1"
        self.source = "a"
        self.unreachable = unreachable


def config(tmp_path: Path, sink: dict[str, Any], *, rule: str = RULE) -> Config:
    return config_from_dict(
        {
            "settings": {"store": str(tmp_path / "s.sqlite")},
            "regions": [{"name": "a", "write": "redis://127.0.0.1:1"}],
            "alerts": {
                "rules": [{"name": rule, "kind": "unreachable", "severity": "critical"}],
                "sinks": [{"name": "am", "kind": "alertmanager", "retries": 0, **sink}],
            },
        },
        where="am.toml",
    )


@pytest.fixture(scope="module")
def am(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary("REPLAG_ALERTMANAGER", "alertmanager")
    with alertmanager(tmp_path_factory.mktemp("am")) as url:
        yield url


def alerts_in(url: str, *, rule: str = RULE, **params: Any) -> list[dict[str, Any]]:
    """The alerts of `rule` Alertmanager's API lists (resolved ones are not listed)."""
    kw = {k: params.pop(k) for k in ("verify", "auth") if k in params}
    found = httpx.get(f"{url}/api/v2/alerts", params=params, timeout=10, **kw).json()
    return [a for a in found if a["labels"]["alertname"] == rule]


def silence_in(url: str, **labels: str) -> str:
    """A silence of an hour in Alertmanager matching `labels`; its id."""
    now = datetime.now(UTC)
    matchers = [
        {"name": k, "value": v, "isRegex": False, "isEqual": True} for k, v in labels.items()
    ]
    body = {
        "matchers": matchers,
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(hours=1)).isoformat(),
        "createdBy": "test",
        "comment": "maintenance",
    }
    answer = httpx.post(f"{url}/api/v2/silences", json=body, timeout=10)
    answer.raise_for_status()
    return str(answer.json()["silenceID"])


def expire_silence(url: str, silence: str) -> None:
    httpx.delete(f"{url}/api/v2/silence/{silence}", timeout=10).raise_for_status()


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_fires_is_kept_alive_silenced_and_resolved(am: str, tmp_path: Path) -> None:
    rule = f"{RULE}-lifecycle"
    sink = {"url": am, "resend": "30s", "labels": {"team": "storage"}}
    cfg = config(tmp_path, sink, rule=rule)
    store = Store(cfg.settings.store)
    fired = await evaluate_and_notify(cfg, store, Report(DOWN))
    assert [d.ok for d in fired.deliveries] == [True], fired.deliveries
    [alert] = alerts_in(am, rule=rule)
    assert alert["labels"] == {
        "alertname": rule,
        "kind": "unreachable",
        "severity": "critical",
        "source": "a",
        "region": "b",
        "replica": "b-1",
        "team": "storage",
    }
    assert alert["status"]["state"] == "active"
    assert alert["annotations"]["state"] == "firing"
    assert "unreachable from a" in alert["annotations"]["summary"]
    # Still firing: no new notification, but posted again, further ahead (4 resends).
    again = await evaluate_and_notify(cfg, store, Report(DOWN))
    assert not again.events and [d.ok for d in again.deliveries] == [True]
    [kept] = alerts_in(am, rule=rule)
    assert kept["startsAt"] == alert["startsAt"]
    assert when(kept["endsAt"]) > when(alert["endsAt"])
    assert when(kept["endsAt"]) - when(kept["updatedAt"]) <= timedelta(seconds=125)

    # A silence in Alertmanager silences it.
    silence = silence_in(am, team="storage", alertname=rule)
    await until(
        lambda: [a["status"]["state"] for a in alerts_in(am, rule=rule)] == ["suppressed"],
        "the alert silenced",
    )
    assert alerts_in(am, rule=rule)[0]["status"]["silencedBy"] == [silence]
    assert alerts_in(am, rule=rule, silenced="false") == []
    expire_silence(am, silence)
    await until(
        lambda: [a["status"]["state"] for a in alerts_in(am, rule=rule)] == ["active"],
        "the alert active again once the silence expired",
    )

    # The heal: resolved (endsAt now), so Alertmanager no longer lists it.
    healed = await evaluate_and_notify(cfg, store, Report([]))
    assert [e.status for e in healed.events] == ["resolved"]
    assert [d.ok for d in healed.deliveries] == [True]
    await until(lambda: alerts_in(am, rule=rule) == [], "the alert resolved in Alertmanager")


async def test_a_fleet_makes_one_alert_there(am: str, tmp_path: Path) -> None:
    """Two service instances on one store: the lease holder notifies and re-posts; after the
    lease moves, the other re-posts the same alert: Alertmanager still has one."""
    rule = f"{RULE}-fleet"
    cfg = config_from_dict(
        {
            "settings": {"store": str(tmp_path / "s.sqlite"), "probe_interval": "10s"},
            "regions": [{"name": "a", "write": "redis://127.0.0.1:1"}],
            "alerts": {
                "rules": [{"name": rule, "kind": "unreachable", "severity": "critical"}],
                "sinks": [{"name": "am", "kind": "alertmanager", "url": am, "resend": "1s"}],
            },
        },
        where="fleet.toml",
    )
    instances = []
    for holder in ("one", "two"):
        store = Store(cfg.settings.store)
        unit = AlertEvaluation(
            cfg, store=store, index=LagIndex(store), metrics=ServiceMetrics(), counters=Counter()
        )
        unit.keeper = LeaseKeeper(store, holder=holder, ttl_s=60.0, units=1)
        instances.append(unit)
    one, two = instances
    assert one.keeper is not None and two.keeper is not None
    assert one.keeper.try_acquire("alerts") is not None
    assert two.keeper.try_acquire("alerts") is None
    record_probe(one.store, source="a", run_id="r1", unreachable=DOWN, error=None)
    try:
        for unit in (one, two, one, two):
            await unit.after_round()
        await until(lambda: len(alerts_in(am, rule=rule)) == 1, "the alert in Alertmanager")
        first = alerts_in(am, rule=rule)[0]
        # The lease moves: the new holder re-posts what fires; the same alert, still one.
        one.keeper.release("alerts")
        assert two.keeper.try_acquire("alerts") is not None
        await two.after_round()
        await until(
            lambda: when(alerts_in(am, rule=rule)[0]["endsAt"]) > when(first["endsAt"]),
            "the new holder's re-post",
        )
        assert len(alerts_in(am, rule=rule)) == 1
        assert one.counters["alert notifications"] == 1
        assert two.counters["alert notifications"] == 0
    finally:
        for unit in instances:
            await unit.sender.close()


async def test_several_alertmanagers_one_down(
    am: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rule = f"{RULE}-ha"
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = config_from_dict(
        {
            "settings": {"store": str(tmp_path / "s.sqlite")},
            "regions": [{"name": "a", "write": "redis://127.0.0.1:1"}],
            "alerts": {
                "rules": [{"name": rule, "kind": "unreachable"}],
                "sinks": [{"name": "am", "kind": "alertmanager", "urls": [dead, am]}],
            },
        },
        where="ha.toml",
    )
    with caplog.at_level(logging.WARNING):
        out = await evaluate_and_notify(cfg, Store(cfg.settings.store), Report(DOWN))
    assert [d.ok for d in out.deliveries] == [True]
    assert len(alerts_in(am, rule=rule)) == 1
    assert f"Alertmanager {dead}" in caplog.text and "1 of 2 took the alerts" in caplog.text


async def test_tls_and_basic_auth_and_no_secret_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    binary("REPLAG_ALERTMANAGER", "alertmanager")
    pki = make_pki(tmp_path / "pki")
    web_config = (
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"basic_auth_users:\n  replag: '{PASSWORD_HASH}'\n"
    )
    auth = ("replag", PASSWORD)
    verify = ssl.create_default_context(cafile=str(pki.ca))
    with alertmanager(tmp_path / "am", web_config=web_config, verify=verify, auth=auth) as url:

        def sink(password: str) -> dict[str, Any]:
            return {
                "url": url,
                "ca_file": str(pki.ca),
                "basic_user": "replag",
                "basic_password": password,
            }

        cfg = config(tmp_path, sink(PASSWORD))
        out = await evaluate_and_notify(cfg, Store(cfg.settings.store), Report(DOWN))
        assert [d.ok for d in out.deliveries] == [True], out.deliveries
        assert len(alerts_in(url, verify=verify, auth=auth)) == 1

        wrong = "wrong-password-1234"
        cfg = config(tmp_path / "w", sink(wrong))
        with caplog.at_level(logging.DEBUG):
            out = await evaluate_and_notify(cfg, Store(cfg.settings.store), Report(DOWN))
        [result] = out.deliveries
        assert not result.ok and "HTTP 401" in (result.error or "")
        assert wrong not in caplog.text and wrong not in repr(cfg.alerts.sinks)
        assert cfg.alerts.sinks[0].to_dict()["auth"] == "basic"
        assert wrong not in str(cfg.alerts.sinks[0].to_dict())


async def test_bearer_token_sent_and_never_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((request.headers.get("Authorization", ""), await request.json()))
        return web.Response(status=403 if len(seen) > 1 else 200, text="denied")

    app = web.Application()
    app.router.add_post("/api/v2/alerts", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    token = "s3cret-bearer-token-42"
    try:
        cfg = config_from_dict(
            {
                "settings": {"store": str(tmp_path / "s.sqlite")},
                "regions": [{"name": "a", "write": "redis://127.0.0.1:1"}],
                "alerts": {
                    "rules": [{"name": RULE, "kind": "unreachable"}],
                    "sinks": [
                        {
                            "name": "am",
                            "kind": "alertmanager",
                            "url": url,
                            "bearer_token_env": "AM_TOKEN",
                            "retries": 0,
                        }
                    ],
                },
            },
            where="bearer.toml",
            environ={"AM_TOKEN": token},
        )
        store = Store(cfg.settings.store)
        with caplog.at_level(logging.DEBUG):
            await evaluate_and_notify(cfg, store, Report(DOWN))
            refused = await evaluate_and_notify(cfg, store, Report(DOWN))
        assert seen[0][0] == f"Bearer {token}"
        [alert] = seen[0][1]
        assert set(alert) == {"labels", "annotations", "startsAt", "endsAt"}
        assert not refused.deliveries[0].ok
        assert token not in caplog.text and token not in repr(cfg.alerts.sinks[0])
    finally:
        await runner.cleanup()


def test_config_refuses_what_an_alertmanager_sink_cannot_use(tmp_path: Path) -> None:
    from replag.errors import ConfigError

    def sink(**kw: Any) -> None:
        config_from_dict(
            {
                "regions": [{"name": "a", "write": "redis://127.0.0.1:1"}],
                "alerts": {"sinks": [{"name": "am", "kind": "alertmanager", **kw}]},
            },
            where="bad.toml",
        )

    for kw, message in (
        ({}, "give url or urls"),
        ({"urls": ["ftp://x"]}, "http:// or https://"),
        ({"url": "http://a:9093", "labels": {"bad-name": "x"}}, "label name"),
        ({"url": "http://a:9093", "basic_user": "u"}, "basic_password"),
        ({"url": "http://a:9093", "bearer_token": "t", "basic_user": "u",
          "basic_password": "p"}, "not both"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            sink(**kw)
    with pytest.raises(ConfigError, match="only an alertmanager sink"):
        config_from_dict(
            {
                "regions": [{"name": "a", "write": "redis://127.0.0.1:1"}],
                "alerts": {"sinks": [{"name": "w", "kind": "webhook", "url": "http://h/",
                                      "urls": ["http://h/"]}]},
            },
            where="bad.toml",
        )  # fmt: skip


async def test_resend_only_alertmanager_sinks_and_only_when_due(tmp_path: Path) -> None:
    posted: list[Any] = []

    async def handle(request: web.Request) -> web.Response:
        posted.append(await request.json())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    firing = AlertEvent(
        fingerprint="fp", rule="lag", status="firing", labels={"alertname": "lag", "x": ""},
        value=250.0, summary="p99 lag 250 ms", starts_ns=1_700_000_000 * 10**9,
    )  # fmt: skip
    sinks = [
        AlertSink(name="am", kind="alertmanager", url=url, urls=(url,), resend_s=60.0),
        AlertSink(name="hook", kind="webhook", url=f"{url}/hook"),
    ]
    sender = AlertSender(sinks, Store(str(tmp_path / "s.sqlite")))
    sender.min_valid_s = 600.0
    try:
        assert [r.ok for r in await sender.resend([firing], now_s=1000.0)] == [True]
        assert await sender.resend([firing], now_s=1059.0) == []  # not due yet
        assert [r.ok for r in await sender.resend([firing], now_s=1060.0)] == [True]
    finally:
        await sender.close()
        await runner.cleanup()
    assert len(posted) == 2 and all(isinstance(body, list) for body in posted)
    [alert] = posted[0]
    # An empty label is no label to Alertmanager; endsAt is the longer of 4 resends and
    # the evaluation's own bound.
    assert alert["labels"] == {"alertname": "lag"}
    ahead = when(alert["endsAt"]) - datetime.now(UTC)
    assert timedelta(seconds=500) < ahead <= timedelta(seconds=600)
