"""Alert config, rules and the persisted state machine (pending → firing → resolved)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from replag.alerts.evaluate import AlertBook, evaluate_and_notify
from replag.alerts.health import record_check, record_probe
from replag.alerts.rules import evaluate_rules
from replag.config import Config, config_from_dict
from replag.errors import ConfigError
from replag.lagindex import LagIndex
from replag.store import LagWindow, Store
from tests.helpers.lag_windows import add_windows

MIN = 60 * 10**9


def clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def make_config(tmp_path: Path, rules: list[dict[str, Any]], **alerts: Any) -> Config:
    data = {
        "settings": {"store": str(tmp_path / "s.sqlite")},
        "regions": [
            {"name": "us-east", "write": "redis://127.0.0.1:1", "replicas": []},
            {"name": "eu-west", "replicas": ["redis://127.0.0.1:2"]},
        ],
        "groups": [{"name": "main", "members": ["redis://127.0.0.1:3", "redis://127.0.0.1:4"]}],
        "alerts": {"rules": rules, **alerts},
    }
    return config_from_dict(data, where="replag.toml", environ={})


@pytest.mark.parametrize(
    ("alerts", "where", "message"),
    [
        ({"rules": [{"name": "x", "kind": "lag"}]}, "alerts.rules[0].kind", "expected one of"),
        (
            {"rules": [{"name": "x", "kind": "lag_p99", "threshold": "fast"}]},
            "alerts.rules[0].threshold",
            "not a duration",
        ),
        (
            {"rules": [{"name": "x", "kind": "probe_loss", "threshold": 2}]},
            "alerts.rules[0].threshold",
            "between 0 and 1",
        ),
        (
            {"sinks": [{"name": "s", "kind": "webhook", "url": "ftp://x"}]},
            "alerts.sinks[0].url",
            "http",
        ),
        ({"sinks": [{"name": "s", "kind": "pagerduty"}]}, "alerts.sinks[0]", "routing_key"),
        (
            {"sinks": [{"name": "s", "kind": "webhook", "url": "http://h", "secret_env": "NOPE"}]},
            "alerts.sinks[0].secret_env",
            "NOPE is not set",
        ),
        ({"bogus": 1}, "alerts", "unknown key 'bogus'"),
    ],
)
def test_config_errors_name_file_and_key(alerts: dict[str, Any], where: str, message: str) -> None:
    data = {"regions": [{"name": "a", "write": "redis://h:1"}], "alerts": alerts}
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, where="replag.toml", environ={})
    assert info.value.where == f"replag.toml: {where}"
    assert message in info.value.message


def test_secrets_stay_out_of_repr_and_public_dicts() -> None:
    data = {
        "regions": [{"name": "a", "write": "redis://h:1"}],
        "alerts": {
            "sinks": [
                {"name": "hook", "kind": "webhook", "url": "http://h/x", "secret": "hmac-s3cret"},
                {"name": "pd", "kind": "pagerduty", "routing_key_env": "PD_KEY"},
                {"name": "chat", "kind": "slack", "url": "https://hooks.slack.test/T0/B0/tok3n"},
            ]
        },
    }
    config = config_from_dict(data, where="f", environ={"PD_KEY": "pd-r0uting"})
    shown = repr(config.alerts) + repr([s.to_dict() for s in config.alerts.sinks])
    for secret in ("hmac-s3cret", "pd-r0uting", "tok3n"):
        assert secret not in shown
    assert config.alerts.sinks[1].routing_key == "pd-r0uting"


def test_p99_rule_goes_pending_then_firing_then_resolved(tmp_path: Path) -> None:
    config = make_config(tmp_path, [
        {"name": "lag", "kind": "lag_p99", "threshold": "100ms", "for": "2m", "over": "5m",
         "severity": "critical"},
    ])  # fmt: skip
    store = Store(tmp_path / "s.sqlite")
    add_windows(store, pairs=[("us-east", "eu-west", 250.0)], minutes=5)
    index = LagIndex(store)
    t0 = store.execute("SELECT MAX(end_ns) FROM lag_windows")[0][0]
    book = AlertBook(store)

    def step(at: int) -> list[str]:
        conditions = evaluate_rules(config, index, now_ns=at)
        events = book.apply(conditions, now_ns=at, repeat_interval_s=3600)
        return [f"{e.status}{'+' if e.repeat else ''}" for e in events]

    assert step(t0) == []  # pending: the condition must hold for 2 minutes
    assert [a["status"] for a in book.active()] == ["pending"]
    assert step(t0 + MIN) == []
    assert step(t0 + 2 * MIN) == ["firing"]
    assert step(t0 + 3 * MIN) == []  # deduplicated until the repeat interval
    # A restarted service (new objects on the same store) carries on. No window in the last
    # 5 min is no data (the source stopped probing), not recovery: it keeps firing.
    book = AlertBook(Store(tmp_path / "s.sqlite"))
    assert step(t0 + 63 * MIN) == ["firing+"]
    [alert] = book.active()
    assert alert["status"] == "firing" and alert["value"] == pytest.approx(275, rel=0.01)
    assert alert["nodata_since_ns"] == t0 + 63 * MIN
    assert "no probe sent from us-east (no data since " in alert["summary"]
    add_windows(store, pairs=[("us-east", "eu-west", 20.0)], minutes=5, end_ns=t0 + 70 * MIN)
    assert step(t0 + 70 * MIN) == ["resolved"]
    assert book.active() == []
    history = book.history()
    assert [h["status"] for h in history] == ["resolved", "firing", "pending"]
    assert history[0]["value"] == pytest.approx(22, rel=0.01)  # the value that resolved it
    assert history[0]["summary"] == (
        f"resolved after 1h08m of firing (since {clock(t0 + 2 * MIN)}): "
        "us-east→eu-west replica eu-west-1: p99 lag 22.0 ms over the last 300 s (limit 100.0 ms)"
    )


def test_repeat_interval_renotifies_a_firing_alert(tmp_path: Path) -> None:
    config = make_config(tmp_path, [{"name": "lag", "kind": "lag_p99", "threshold": "1ms"}])
    store = Store(tmp_path / "s.sqlite")
    add_windows(store, pairs=[("us-east", "eu-west", 50.0)], minutes=200)
    index, book = LagIndex(store), AlertBook(store)
    t0 = store.execute("SELECT MAX(end_ns) FROM lag_windows")[0][0] - 150 * MIN
    statuses = []
    for minute in range(0, 150, 10):
        conditions = evaluate_rules(config, index, now_ns=t0 + minute * MIN)
        events = book.apply(conditions, now_ns=t0 + minute * MIN, repeat_interval_s=3600)
        statuses += [(minute, e.status, e.repeat) for e in events]
    assert statuses == [(0, "firing", False), (60, "firing", True), (120, "firing", True)]


def test_loss_divergence_unreachable_and_no_probe_rules(tmp_path: Path) -> None:
    config = make_config(tmp_path, [
        {"name": "loss", "kind": "probe_loss", "threshold": 0.05},
        {"name": "diverged", "kind": "divergent_keys"},
        {"name": "down", "kind": "unreachable"},
        {"name": "stale", "kind": "no_probe", "threshold": "10m"},
    ])  # fmt: skip
    store = Store(tmp_path / "s.sqlite")
    add_windows(store, pairs=[("us-east", "eu-west", 5.0)], minutes=3, lost=10)
    now = store.execute("SELECT MAX(end_ns) FROM lag_windows")[0][0]
    record_check(store, group="main", divergent=7, run_id="r1", error=None)
    record_probe(
        store,
        source="us-east",
        run_id="p1",
        error=None,
        unreachable=[{"replica": "eu-1", "region": "eu-west", "error": "refused"}],
    )
    active = {
        c.rule.name: c for c in evaluate_rules(config, LagIndex(store), now_ns=now) if c.active
    }
    assert set(active) == {"loss", "diverged", "down"}
    assert active["diverged"].labels == {"group": "main"}
    assert active["down"].labels["replica"] == "eu-1"
    later = evaluate_rules(config, LagIndex(store), now_ns=now + 11 * MIN)
    assert [c.rule.name for c in later if c.active] == ["diverged", "down", "stale"]


def test_a_failed_check_neither_resolves_nor_fires_the_divergence_alert(tmp_path: Path) -> None:
    config = make_config(tmp_path, [{"name": "diverged", "kind": "divergent_keys"}])
    store = Store(tmp_path / "s.sqlite")
    index, book = LagIndex(store), AlertBook(store)

    def step(at: int) -> list[str]:
        conditions = evaluate_rules(config, index, now_ns=at)
        return [e.status for e in book.apply(conditions, now_ns=at, repeat_interval_s=3600)]

    t0 = 1_700_000_000 * 10**9
    record_check(store, group="main", divergent=7, run_id="r1", error=None)
    assert step(t0) == ["firing"]
    # A replica is down: the check fails, which is no evidence the divergence is gone.
    record_check(store, group="main", divergent=None, run_id=None, error="refused")
    assert step(t0 + MIN) == []
    [alert] = book.active()
    assert alert["status"] == "firing" and alert["value"] == 7
    assert "the latest check failed: refused" in alert["summary"]
    record_check(store, group="main", divergent=0, run_id="r2", error=None)
    assert step(t0 + 2 * MIN) == ["resolved"]
    # Nor does a failure after a clean check start one.
    record_check(store, group="main", divergent=None, run_id=None, error="refused")
    assert step(t0 + 3 * MIN) == [] and book.active() == []


def test_subjects_gone_from_the_config_are_ignored_and_their_alerts_resolve(
    tmp_path: Path,
) -> None:
    rules = [
        {"name": "diverged", "kind": "divergent_keys"},
        {"name": "down", "kind": "unreachable"},
    ]
    store = Store(tmp_path / "s.sqlite")
    index, book = LagIndex(store), AlertBook(store)
    for group in ("main", "retired"):
        record_check(store, group=group, divergent=3, run_id="r1", error=None)
    for source in ("us-east", "ap-south"):
        down = [{"replica": "eu-1", "region": "eu-west", "error": "refused"}]
        record_probe(store, source=source, run_id="p1", error=None, unreachable=down)
    config = make_config(tmp_path, rules)  # group main and source us-east only
    t0 = 1_700_000_000 * 10**9
    conditions = evaluate_rules(config, index, now_ns=t0)
    subjects = sorted(c.labels.get("group") or c.labels["source"] for c in conditions)
    assert subjects == ["main", "us-east"]
    assert len(book.apply(conditions, now_ns=t0, repeat_interval_s=3600)) == 2
    # The next config renames the group and drops us-east's write endpoint.
    data = {
        "settings": {"store": str(tmp_path / "s.sqlite")},
        "regions": [{"name": "us-east", "replicas": ["redis://127.0.0.1:1"]}],
        "groups": [{"name": "main-v2", "members": ["redis://127.0.0.1:3", "redis://127.0.0.1:4"]}],
        "alerts": {"rules": rules},
    }
    config = config_from_dict(data, where="replag.toml", environ={})
    conditions = evaluate_rules(config, index, now_ns=t0 + MIN)
    assert conditions == []
    events = book.apply(conditions, now_ns=t0 + MIN, repeat_interval_s=3600)
    assert sorted(e.status for e in events) == ["resolved", "resolved"]
    assert book.active() == []


async def test_evaluate_and_notify_without_sinks_records_the_report(tmp_path: Path) -> None:
    config = make_config(tmp_path, [{"name": "down", "kind": "unreachable"}])
    store = Store(tmp_path / "s.sqlite")

    @dataclass
    class Report:
        run_id: str = "run1"
        source: str = "us-east"
        unreachable: list[dict[str, str]] = field(
            default_factory=lambda: [{"replica": "eu-1", "region": "eu-west", "error": "timeout"}]
        )

    outcome = await evaluate_and_notify(config, store, Report())
    assert [e.status for e in outcome.events] == ["firing"]
    assert outcome.deliveries == []
    again = await evaluate_and_notify(config, store, Report())
    assert again.events == [] and again.firing == 1


def add_partition(store: Store, *, minutes: range, t0: int, target: str = "eu-west") -> None:
    """Windows of a partitioned target: every probe sent, none seen (so no p99 at all)."""
    store.append_windows([
        LagWindow(run_id=f"cut{m}", source="us-east", target=target, replica=f"{target}-1",
                  start_ns=t0 + (m - 1) * MIN, end_ns=t0 + m * MIN, sent=50, seen=0, lost=50)
        for m in minutes
    ])  # fmt: skip


@pytest.mark.parametrize(
    ("no_data", "during", "after"),
    [
        ("keep_firing", [], ["resolved"]),
        ("nodata", ["nodata"], ["resolved"]),
        ("ok", ["resolved"], []),
    ],
)
def test_a_partition_is_no_data_for_the_lag_rule(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    no_data: str,
    during: list[str],
    after: list[str],
) -> None:
    config = make_config(tmp_path, [
        {"name": "lag", "kind": "lag_p99", "threshold": "100ms", "no_data": no_data},
        {"name": "loss", "kind": "probe_loss", "threshold": 0.01},
    ])  # fmt: skip
    store = Store(tmp_path / "s.sqlite")
    t0 = 1_700_000_000 * 10**9
    add_windows(store, pairs=[("us-east", "eu-west", 250.0)], minutes=5, end_ns=t0)
    index, book = LagIndex(store), AlertBook(store)

    def step(at: int) -> list[tuple[str, str]]:
        conditions = evaluate_rules(config, index, now_ns=at)
        events = book.apply(conditions, now_ns=at, repeat_interval_s=3600)
        return [(e.rule, e.state) for e in events]

    caplog.set_level("INFO", logger="replag.alerts")
    assert step(t0) == [("lag", "firing")]
    add_partition(store, minutes=range(1, 11), t0=t0)
    assert step(t0 + 3 * MIN) == [("loss", "firing")]  # the lag rule still has 250 ms samples
    assert step(t0 + 10 * MIN) == [("lag", state) for state in during]
    states = {a["rule"]: a for a in book.active()}
    assert states["loss"]["status"] == "firing" and states["loss"]["value"] == 1.0
    if no_data == "ok":
        assert "lag" not in states
    else:
        lag = states["lag"]
        assert lag["status"] == {"keep_firing": "firing", "nodata": "nodata"}[no_data]
        assert lag["nodata_since_ns"] == t0 + 10 * MIN
        assert "no lag measured in the last 300 s: all 300 probes lost" in lag["summary"]
    # Healed: the backlog and fresh probes arrive at 20 ms.
    add_windows(store, pairs=[("us-east", "eu-west", 20.0)], minutes=6, end_ns=t0 + 16 * MIN)
    assert sorted(step(t0 + 16 * MIN)) == sorted(
        [("loss", "resolved")] + [("lag", state) for state in after]
    )
    assert book.active() == []
    lines = [r.getMessage() for r in caplog.records if r.name == "replag.alerts.state"]
    assert lines[1].startswith(
        "alert lag firing: us-east→eu-west replica eu-west-1: p99 lag 275.2 ms"
    )
    assert any(line.startswith("alert loss resolved: resolved after 13m") for line in lines)
    if no_data == "keep_firing":
        assert any(line.startswith("alert lag firing, kept (no data): ") for line in lines)


def test_a_store_from_before_no_data_states_gains_the_column(tmp_path: Path) -> None:
    # A store written by a replag from before no-data states (and before migrations).
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        db.execute(
            "CREATE TABLE alert_state (fingerprint TEXT PRIMARY KEY, rule TEXT NOT NULL, "
            "labels_json TEXT NOT NULL, status TEXT NOT NULL, value REAL, summary TEXT NOT NULL, "
            "active_since_ns INTEGER NOT NULL, fired_ns INTEGER, resolved_ns INTEGER, "
            "last_notified_ns INTEGER, updated_ns INTEGER NOT NULL)"
        )
        db.execute(
            "INSERT INTO alert_state VALUES "
            "('fp', 'lag', '{}', 'firing', 1.0, 's', 1, 1, NULL, 1, 1)"
        )
    db.close()
    store = Store(tmp_path / "s.sqlite")
    [alert] = AlertBook(store).active()
    assert alert["status"] == "firing" and alert["nodata_since_ns"] is None
