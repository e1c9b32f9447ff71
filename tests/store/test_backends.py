"""Everything the store keeps, on SQLite and on PostgreSQL: migrations, repair runs with
checkpoints and key lists, alert state and events, probe and group health, replication
history and Dynomite stats. The same statements run on both; rows are read by name."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import psycopg
import pytest

from replag.alerts.condition import Condition
from replag.alerts.config import AlertRule, AlertSink
from replag.alerts.delivery import AlertSender, DeliveryResult
from replag.alerts.health import group_health, probe_health, record_check, record_probe
from replag.alerts.state import AlertBook
from replag.errors import ConfigError, StoreError
from replag.monitoring.dynomite_figures import FIGURE_NAMES, DynomiteStats
from replag.monitoring.dynomite_stats import prune_stats, recent_stats, record_stats
from replag.repair.bulk.rebuild_log import RebuildLog
from replag.repair.runs import RUNNING, RunLog, count_runs, get_run, list_runs
from replag.repair.scan.scanner import ScanProgress
from replag.repair.trees.tictac import TictacTree
from replag.replication import history
from replag.replication.rpo import assess_failover
from replag.replication.state import PrimaryState, ReplicaState, ReplicationSnapshot
from replag.store import Store, parse_location
from replag.store.migrations import MIGRATIONS, latest_version


def test_a_new_store_is_at_the_latest_schema_and_reopening_changes_nothing(
    store_location: str,
) -> None:
    with Store(store_location) as store:
        versions = [r.version for r in store.execute("SELECT version FROM schema_migrations")]
        assert sorted(versions) == list(range(1, latest_version() + 1))
        columns = {r.name for r in _columns(store, "dynomite_stats")}
        assert set(FIGURE_NAMES) <= columns, "a new Dynomite figure needs a migration"
    with Store(store_location) as again:
        assert len(again.execute("SELECT version FROM schema_migrations")) == latest_version()


def test_a_store_from_a_newer_replag_is_refused_in_one_line(store_location: str) -> None:
    with Store(store_location) as store:
        store.execute(
            "INSERT INTO schema_migrations (version, name, applied_ns) VALUES (?, 'future', 0)",
            (latest_version() + 1,),
        )
    try:
        with pytest.raises(StoreError, match="newer than this replag") as caught:
            Store(store_location)
        assert "\n" not in str(caught.value)
    finally:
        _forget_version(store_location, latest_version() + 1)


def test_migrations_are_numbered_without_gaps() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, latest_version() + 1))


def test_an_old_sqlite_store_is_adopted(tmp_path: Path) -> None:
    # A store from before migrations: tables made by the components, no history table.
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE repair_runs (run_id TEXT PRIMARY KEY, kind TEXT NOT NULL, "
            "status TEXT NOT NULL, started_ns INTEGER NOT NULL, finished_ns INTEGER, "
            "params_json TEXT NOT NULL, report_json TEXT, error TEXT)"
        )
        db.execute(
            "INSERT INTO repair_runs VALUES ('check-1', 'check', 'done', 1, 2, '{}', NULL, NULL)"
        )
    db.close()
    with Store(str(path)) as store:
        [run] = list_runs(store)
        assert run["run_id"] == "check-1" and run["owner"] is None


def test_unknown_schemes_are_refused_and_passwords_never_shown() -> None:
    with pytest.raises(ConfigError, match="unknown store scheme 'mysql'"):
        parse_location("mysql://u:secret@h/db")
    with pytest.raises(ConfigError, match="without '//'"):
        parse_location("postgresql:/replag@db/replag")
    shown = parse_location("postgresql://replag:secret@db:5432/replag").shown
    assert "secret" not in shown and shown == "postgresql://replag:***@db:5432/replag"
    assert parse_location("sqlite:///var/lib/replag.sqlite").target == "/var/lib/replag.sqlite"
    assert parse_location("~/x.sqlite").backend == "sqlite"


def test_repair_runs_keep_checkpoints_key_lists_and_their_owner(store: Store) -> None:
    log = RunLog.create(store, kind="check", params={"group": "g1"})
    tree = TictacTree(depth=8)
    tree.add(np.array([2**63 + 5], dtype=np.uint64), np.array([42], dtype=np.uint64))
    progress = ScanProgress("r1", b"1234", 10, 1.5, False)
    progress.total = 100
    log.save_scan("g1", progress, tree)
    progress.keys = 20
    log.save_scan("g1", progress, tree)  # a checkpoint replaces the last one
    state, saved = log.load_scan("g1", "r1")
    assert (state.cursor, state.keys, state.total, state.finished) == (b"1234", 20, 100, False)
    assert saved is not None and saved.to_bytes() == tree.to_bytes()
    log.set_group_phase("g1", "scanned", {"keys": 20})
    log.set_group_phase("g1", "verified", {"keys": 20})
    assert log.group_phase("g1") == ("verified", {"keys": 20})
    log.add_keys(
        "g1", [(b"\x00bin", "differs", "pending", {"a": 1}), (b"k2", "missing", "pending", {})]
    )
    log.add_keys("g1", [(b"k2", "missing", "repaired", {"by": "quorum"})])
    assert [(k, s) for k, _, s, _ in log.keys("g1")] == [
        (b"\x00bin", "pending"),
        (b"k2", "repaired"),
    ]
    assert [k for k, *_ in log.keys("g1", status="repaired")] == [b"k2"]
    log.drop_scans("g1")
    assert log.load_scan("g1", "r1")[1] is None
    [run] = list_runs(store)
    assert run["status"] == RUNNING and run["owner"] and run["owner_alive"] is True
    assert count_runs(store) == 1 and get_run(store, log.run_id) is not None


def test_a_rebuild_checkpoint(store: Store) -> None:
    log = RebuildLog(store, "rebuild-1")
    assert log.load() is None
    log.save(b"0", {"copied": 0})
    log.save(b"17", {"copied": 5})
    log.add_pending(1, [b"a", b"\x00b"])
    log.add_pending(2, [b"c"])
    log.drop_pending(1)
    assert log.load() == (b"17", {"copied": 5})
    assert log.pending() == [(2, [b"c"])]


def test_a_run_whose_owner_stopped_beating_is_shown_as_dead(store: Store) -> None:
    log = RunLog.create(store, kind="repair", params={})
    store.execute(
        "UPDATE repair_runs SET heartbeat_ns = heartbeat_ns - ? WHERE run_id = ?",
        (3600 * 10**9, log.run_id),
    )
    run = get_run(store, log.run_id)
    assert run is not None and run["owner_alive"] is False
    assert "died" in run["error"] and f"--resume {log.run_id}" in run["error"]
    log.heartbeat()  # a resumed run is owned again
    assert get_run(store, log.run_id)["owner_alive"] is True  # type: ignore[index]


def test_alert_state_events_and_deliveries(store: Store) -> None:
    rule = AlertRule(name="lag", kind="lag_p99", threshold=100.0)
    book = AlertBook(store)
    firing = Condition(rule=rule, labels={"source": "a"}, active=True, value=250.0, summary="slow")
    [event] = book.apply([firing], now_ns=10**18, repeat_interval_s=3600)
    assert event.status == "firing" and book.firing_count() == 1
    book.apply([firing], now_ns=10**18 + 10**9, repeat_interval_s=3600)  # no repeat yet
    clear = Condition(rule=rule, labels={"source": "a"}, active=False, value=5.0, summary="ok")
    [resolved] = book.apply([clear], now_ns=10**18 + 2 * 10**9, repeat_interval_s=3600)
    assert resolved.status == "resolved" and book.firing_count() == 0
    assert [h["status"] for h in book.history()] == ["resolved", "firing", "pending"]
    assert book.prune_events(10**18 + 1) == 2
    sender = AlertSender([AlertSink(name="hook", kind="webhook", url="http://x")], store)
    sender._record(sender.sinks[0], DeliveryResult(sink="hook", ok=True, attempts=1))
    sender._record(sender.sinks[0], DeliveryResult(sink="hook", ok=False, attempts=3, error="e"))
    [status] = sender.statuses()
    assert (status["delivered"], status["failed"], status["last_error"]) == (1, 1, "e")
    assert status["last_ok_ns"] is not None


def test_probe_and_group_health(store: Store) -> None:
    record_probe(store, source="a", run_id="r1", unreachable=[], error=None, at_ns=100)
    record_probe(
        store, source="a", run_id=None, unreachable=[{"replica": "x"}], error="down", at_ns=200
    )
    health = probe_health(store)["a"]
    assert (health.last_success_ns, health.last_run_id, health.error) == (100, "r1", "down")
    record_check(store, group="g", divergent=3, run_id="c1", error=None, at_ns=1)
    record_check(store, group="g", divergent=None, run_id=None, error="timeout", at_ns=2)
    g = group_health(store)["g"]
    assert (g.divergent, g.run_id, g.error, g.checked_ns) == (3, "c1", "timeout", 2)


def _primary(sampled_ns: int, behind: int) -> PrimaryState:
    replica = ReplicaState(
        replica="b-1",
        region="b",
        address="",
        status="ok",
        bytes_behind=behind,
        offset=1000 - behind,
        headroom_fraction=0.5,
    )
    return PrimaryState(
        source="a",
        primary="a-primary",
        address="h:1",
        sampled_ns=sampled_ns,
        offset=1000,
        sync_full=1,
        replicas=(replica,),
    )


def test_replication_history(store: Store) -> None:
    for i, behind in enumerate([5, 50, 7]):
        history.record_snapshot(store, ReplicationSnapshot(primaries=[_primary(i * 10, behind)]))
    [latest] = history.latest_primaries(store)
    assert latest.sampled_ns == 20 and latest.offset == 1000
    assert latest.replicas[0].bytes_behind == 7 and latest.replicas[0].offset == 993
    series = history.replica_series(store, source="a", replica="b-1", since_ns=0)
    assert [s.bytes_behind for _, s in series] == [5, 50, 7]
    record = history.WritePrimary(
        region="a", master="m", address="h:1", replid="x", offset=5, updated_ns=1
    )
    history.remember_write_primary(store, record)
    history.remember_write_primary(store, history.WritePrimary(**{**record.__dict__, "offset": 9}))
    assert history.write_primary(store, "a").offset == 9  # type: ignore[union-attr]
    history.record_failover(store, {"detected_ns": 15, "source": "a", "to": "h:2"})
    assert history.failover_events(store, since_ns=10)[0]["to"] == "h:2"
    # Thinning keeps each window's worst replica sample (50 bytes behind) and last primary.
    assert history.thin(store, older_than_ns=30, window_ns=30) == 4
    assert [
        s.bytes_behind
        for _, s in history.replica_series(store, source="a", replica="b-1", since_ns=0)
    ] == [50]
    assert history.prune(store, 100) == {
        "replication_primaries": 1,
        "replication_replicas": 1,
        "failover_events": 1,
    }


def test_a_stored_sample_keeps_what_the_failover_advice_reads(store: Store) -> None:
    """A writable replica, a syncing one and a priority-0 one, read back from the store:
    the advice of that past moment passes each over, as the live one did."""
    replicas = (
        ReplicaState(replica="w", region="b", address="", status="ok", bytes_behind=0,
                     offset=1000, read_only=False, priority=100),
        ReplicaState(replica="s", region="b", address="", status="syncing", bytes_behind=0,
                     sync_in_progress=True, read_only=True, error="a full resync"),
        ReplicaState(replica="z", region="b", address="", status="ok", bytes_behind=0,
                     offset=1000, read_only=True, priority=0),
        ReplicaState(replica="u", region="b", address="", status="ok", bytes_behind=0,
                     offset=1000),
    )  # fmt: skip
    primary = PrimaryState(
        source="a", primary="p", address="h:1", sampled_ns=5, offset=1000, replicas=replicas
    )
    history.record_snapshot(store, ReplicationSnapshot(primaries=[primary]))
    [stored] = history.latest_primaries(store)
    got = {r.replica: r for r in stored.replicas}
    assert (got["w"].read_only, got["w"].priority) == (False, 100)
    assert got["s"].sync_in_progress and got["s"].error == "a full resync"
    assert (got["z"].read_only, got["z"].priority) == (True, 0)
    assert got["u"].read_only is None and not got["u"].sync_in_progress
    advice = assess_failover(stored, lag_p99_ms={})
    passed = {c.replica: c.reason for c in advice.candidates if not c.eligible}
    assert "writable" in (passed["w"] or "")
    assert "a full resync" in (passed["s"] or "")
    assert "replica-priority 0" in (passed["z"] or "")
    assert advice.safest is not None and advice.safest.replica == "u"


def test_dynomite_stats(store: Store) -> None:
    def sample(node: str, at: int, dropped: int) -> DynomiteStats:
        figures = dict.fromkeys(FIGURE_NAMES, 0) | {"peer_dropped_requests": dropped}
        return DynomiteStats(
            node=node,
            dc="dc1",
            rack="r1",
            sampled_ns=at,
            uptime_s=at,
            figures=figures,
            backends=("127.0.0.1:6379",),
        )

    record_stats(store, [sample("n1", 1, 0), sample("n2", 1, 0)])
    record_stats(store, [sample("n1", 2, 5), sample("n2", 2, 0)])
    latest = recent_stats(store, limit=1)
    assert [(s.node, s.figures["peer_dropped_requests"]) for s in latest] == [("n1", 5), ("n2", 0)]
    assert latest[0].backends == ("127.0.0.1:6379",)
    assert prune_stats(store, 2) == 2 and len(recent_stats(store, node="n1", limit=5)) == 1


def _columns(store: Store, table: str) -> list[object]:
    if store.backend == "sqlite":
        return list(store.execute(f"PRAGMA table_info({table})"))
    return list(
        store.execute(
            "SELECT column_name AS name FROM information_schema.columns WHERE table_name = ?",
            (table,),
        )
    )


def _forget_version(location: str, version: int) -> None:
    """Delete a schema_migrations row without opening a Store (which would refuse)."""
    if parse_location(location).backend == "sqlite":
        with sqlite3.connect(location) as db:
            db.execute("DELETE FROM schema_migrations WHERE version = ?", (version,))
        db.close()
        return
    with psycopg.connect(location, autocommit=True) as conn:
        conn.execute("DELETE FROM schema_migrations WHERE version = %s", (version,))


def test_the_lag_index_sees_a_window_committed_after_a_higher_id(postgres_url: str) -> None:
    """On PostgreSQL ids are handed out at insert, not at commit: another instance's
    window can become visible after one with a higher id. The index still gets it."""
    from replag.lagindex import LagIndex
    from replag.store import LagWindow
    from replag.store.windows import insert_window
    from tests.helpers.postgres import empty_database

    Store(postgres_url).close()
    empty_database(postgres_url)

    def window(run: str) -> LagWindow:
        w = LagWindow(run_id=run, source="a", target="b", replica="b-1", start_ns=1, end_ns=2,
                      sent=1, seen=1)  # fmt: skip
        w.lag.record_us(1000)
        return w

    with Store(postgres_url) as mine, Store(postgres_url) as theirs:
        index = LagIndex(mine)
        with theirs.begin() as tx:
            sql, params = insert_window(window("slow"))
            tx.execute(sql, params)  # its id is taken now, its row visible at commit
            mine.append_windows([window("fast")])
            index.refresh()
            assert index.summary("a", "b").sent == 1
        index.refresh()
        assert index.summary("a", "b").sent == 2
        index.refresh()
        assert index.summary("a", "b").sent == 2  # looking back adds nothing twice
