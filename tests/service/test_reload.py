"""Reloading a running `replag serve`: SIGHUP and a change of the file, a bad file refused.

A real `replag serve` process over a fleet lab of three small clusters (real Redis
servers): the configuration first names two, then one is removed and one added, by
SIGHUP and then by rewriting the file. The unchanged cluster's probe round runs on
(same lease epoch, its history kept), the removed one's stops, the added one's starts;
a file that does not load, or that changes the store, is refused in one line and the
previous configuration runs on.
"""

from __future__ import annotations

import signal
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from replag.lab.cluster import lab_down
from replag.lab.fleet import fleet_up
from replag.lab.server import free_port
from replag.store import Store
from tests.helpers.cli import spawn_replag
from tests.helpers.waiting import wait_until

SETTINGS = {
    "count": 20,
    "rate": 0,
    "timeout": "2s",
    "probe_interval": "300ms",
    "replication_interval": "1s",
    "check_interval": "1h",
    "lease_time": "6s",
}


@pytest.fixture(scope="module")
def fleet_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    lab_dir = tmp_path_factory.mktemp("fleet") / "lab"
    fleet_up(lab_dir, 3)
    try:
        yield tomllib.loads((lab_dir / "topology.toml").read_text())
    finally:
        lab_down(lab_dir)


def only(topology: dict[str, Any], names: set[str], store: str) -> dict[str, Any]:
    """The lab's configuration with the clusters `names` only."""
    regions = [r for r in topology["regions"] if r["name"] in names]
    groups = [g for g in topology["groups"] if g["name"] in names]
    return {"settings": {**SETTINGS, "store": store}, "regions": regions, "groups": groups}


def runs(store: str, source: str, *, after_ns: int = 0) -> int:
    with Store(store) as opened:
        rows = opened.execute(
            "SELECT COUNT(*) AS n FROM probe_runs WHERE source = ? AND started_ns > ?",
            (source, after_ns),
        )
    return int(rows[0].n)


def sources(base: str) -> set[str]:
    health = httpx.get(base + "/api/v1/health", timeout=10).json()
    return set(health["probes"])


def test_reload_by_sighup_and_by_file_change_keeps_history_and_refuses_a_bad_file(
    fleet_lab: dict[str, Any], tmp_path: Path
) -> None:
    store = str(tmp_path / "replag.sqlite")
    config = tmp_path / "replag.toml"
    config.write_text(tomli_w.dumps(only(fleet_lab, {"g000", "g001"}, store)))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    proc = spawn_replag("serve", "--config", str(config), "--port", str(port), log=log_path)
    try:
        wait_until(
            lambda: runs(store, "g000") >= 2 and runs(store, "g001") >= 2,
            "both clusters probed",
            timeout_s=90,
        )
        lag_before = lag_count(base, "g001")
        assert lag_before > 0

        # SIGHUP: g000 removed, g002 added, g001 unchanged.
        config.write_text(tomli_w.dumps(only(fleet_lab, {"g001", "g002"}, store)))
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "configuration reloaded" in log_path.read_text(), "a reload")
        reloaded_ns = time.time_ns()
        text = log_path.read_text()
        assert "added g002" in text and "removed g000" in text, text[-2000:]
        wait_until(lambda: runs(store, "g002") >= 2, "the added cluster probed", timeout_s=60)
        wait_until(lambda: runs(store, "g001", after_ns=reloaded_ns) >= 2, "g001 goes on")
        time.sleep(1)  # a round of g000 under way at the reload may still be stored
        settled_ns = time.time_ns()
        wait_until(lambda: runs(store, "g001", after_ns=settled_ns) >= 3, "more rounds")
        assert runs(store, "g000", after_ns=settled_ns) == 0  # the removed one stopped
        # g001's round ran on: taken once, never restarted; its history is all there.
        assert log_path.read_text().count("probe:g001: now owned") == 1
        assert lag_count(base, "g001") >= lag_before
        wait_until(lambda: sources(base) >= {"g001", "g002"}, "health names the new cluster")

        # A change of the file alone (no signal): g000 back.
        config.write_text(tomli_w.dumps(only(fleet_lab, {"g000", "g001", "g002"}, store)))
        wait_until(lambda: log_path.read_text().count("configuration reloaded") >= 2, "reload 2")
        changed_ns = time.time_ns()
        wait_until(lambda: runs(store, "g000", after_ns=changed_ns) >= 1, "g000 probed again")

        # A file that does not load: refused in one line, the running configuration stays.
        config.write_text("[settings\nprobe_interval = 1s\n")
        wait_until(lambda: "reload refused" in log_path.read_text(), "the bad file refused")
        refusal = [ln for ln in log_path.read_text().splitlines() if "reload refused" in ln]
        assert len(refusal) == 1 and "replag.toml" in refusal[0], refusal
        # A store that changes: refused, naming the setting.
        moved = only(fleet_lab, {"g000"}, str(tmp_path / "other.sqlite"))
        config.write_text(tomli_w.dumps(moved))
        wait_until(lambda: "store cannot change" in log_path.read_text(), "a store change refused")
        refused_ns = time.time_ns()
        wait_until(
            lambda: all(runs(store, s, after_ns=refused_ns) >= 1 for s in ("g001", "g002")),
            "the previous configuration runs on",
        )
        assert proc.poll() is None
        assert "Traceback" not in log_path.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def lag_count(base: str, source: str) -> int:
    lag = httpx.get(base + "/api/v1/lag", params={"since": "1h"}, timeout=10).json()
    return sum(p["seen"] for p in lag["pairs"] if p["source"] == source)
