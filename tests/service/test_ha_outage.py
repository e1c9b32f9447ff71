"""Three `replag serve` on one PostgreSQL when the store fails: stopped under all of them,
cut off from one of them by a relay, and instances restarted one by one.

Watching never waits on the store: probing, alert evaluation and the API go on from
memory while PostgreSQL is stopped, and what was made meanwhile is written when it is
back. An instance cut off from a store the others reach loses its units to them and
stops repairing. Restarting instances hands units over without leaving one unowned.
Settings are scaled down (probe_interval 1 s, lease_time 4 s, an outage of a few lease
times); the bounds asserted are the issue's, in those units.
"""

from __future__ import annotations

import itertools
import threading
import time
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import tomli_w

from replag.lab.cluster import lab_fault
from replag.lab.relay import DelayRelay, Link
from replag.store import Store
from replag.store.leases import current
from tests.helpers.configs import TOKEN
from tests.helpers.ha import (
    Instance,
    Receiver,
    gauges_follow_leases,
    owner_of,
    probe_starts,
    repair_accepted,
    start,
    work_shared,
)
from tests.helpers.lab import LabFactory
from tests.helpers.postgres import LocalPostgres
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.waiting import wait_until

PROBE_S = 1.0
LEASE_S = 4.0
SETTINGS = {
    "count": 10,
    "rate": 0,
    "timeout": "500ms",
    "probe_interval": f"{PROBE_S}s",
    "replication_interval": "1s",
    "check_interval": "1h",
    "lease_time": f"{LEASE_S}s",
}
# A window of four probe intervals: a round's windows reach the evaluator through the store a
# round's time (the 500 ms timeout) plus a write after it starts; at two intervals a busy host
# (load 30 on 2 cores) left the window without a stored round and it read as no data
# ("no probe sent from us-east in the last 2 s": resolved, then firing again).
LOST_RULE = {
    "repeat_interval": "1h",
    "rules": [{"name": "eu-west-lost", "kind": "probe_loss", "threshold": 0.5, "over": "4s",
               "target": "eu-west", "no_data": "ok"}],
}  # fmt: skip


def write_config(tmp_path: Path, data: dict[str, Any], name: str = "replag.toml") -> Path:
    data["settings"] = {**data.get("settings", {}), **SETTINGS}
    data["settings"]["store_spill_dir"] = str(tmp_path / "held")
    # Two files (direct and relayed to PostgreSQL) of one fleet share the store on purpose.
    data["settings"]["store_shared"] = True
    path = tmp_path / name
    path.write_text(tomli_w.dumps(data))
    return path


def lab_config(lab: dict[str, Any], url: str, receiver: Receiver) -> dict[str, Any]:
    data = tomllib.loads((Path(lab["dir"]) / "topology.toml").read_text())
    data["settings"]["store"] = url
    hook = {"name": "hook", "kind": "webhook",
            "url": f"http://127.0.0.1:{receiver.server_address[1]}/"}  # fmt: skip
    data["alerts"] = {**LOST_RULE, "sinks": [hook]}
    return data


def runs_counted(instances: list[Instance], source: str) -> float:
    """Probe runs of `source` that the live instances made (each counts its own)."""
    total = 0.0
    for inst in instances:
        if inst.proc.poll() is not None:
            continue
        for line in httpx.get(inst.base + "/metrics", timeout=10).text.splitlines():
            ours = line.startswith("replag_probe_runs_total{") and f'source="{source}"' in line
            if ours and 'outcome="ok"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def longest_gap_s(starts: list[int], since_ns: int, until_ns: int) -> float:
    inside = [s for s in starts if since_ns <= s <= until_ns]
    return max((b - a for a, b in itertools.pairwise(inside)), default=0) / 1e9


@pytest.mark.timeout(240)
def test_postgresql_stopped_under_three_instances(
    lab_factory: LabFactory,
    ha_store: str,
    postgres_server: LocalPostgres,
    tmp_path: Path,
    fleet: list[Instance],
    receiver: Receiver,
) -> None:
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={})
    config = write_config(tmp_path, lab_config(lab, ha_store, receiver))
    start(fleet, config, tmp_path, 3)
    wait_until(lambda: work_shared(fleet), "the work shared out", timeout_s=60, every_s=0.3)
    wait_until(lambda: len(probe_starts(ha_store, "us-east")) >= 3, "probe runs", timeout_s=60)

    postgres_server.stop()
    stopped_ns = time.time_ns()
    answers: list[tuple[str, int]] = []
    last_health: list[Any] = [None]
    try:
        # Every instance answers from memory and names the store in its health.
        def degraded_everywhere() -> bool:
            for inst in fleet:
                for path in ("/api/v1/alerts", "/api/v1/lag/matrix"):
                    got = httpx.get(inst.base + path, timeout=10)
                    answers.append((path, got.status_code))
                    assert got.status_code == 200, (path, got.text)
                health = httpx.get(inst.base + "/api/v1/health", timeout=10)
                answers.append(("/api/v1/health", health.status_code))
                body = last_health[0] = health.json()
                assert "problems" in body, body
                store_problems = [p for p in body["problems"] if p["kind"] == "store"]
                if body["status"] != "degraded" or not store_problems:
                    return False
                assert "unreachable since" in store_problems[0]["message"], store_problems
            return True

        try:
            wait_until(degraded_everywhere, "health degraded", timeout_s=20, every_s=0.3)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the last health: {last_health[0]}") from None
        # Store-only answers: 503 with Retry-After, at once.
        runs = httpx.get(fleet[0].base + "/api/v1/repairs", timeout=10)
        assert runs.status_code == 503 and runs.headers["Retry-After"], runs.text
        # An alert whose condition starts during the outage fires.
        lab_fault(Path(lab["dir"]), "eu-west", "partition")
        wait_until(
            lambda: "firing" in receiver.statuses("eu-west-lost"),
            "the alert fires during the outage",
            timeout_s=30,
            every_s=0.3,
        )
        # Longer than a lease: nobody's units lapse while nobody can take them.
        while time.time_ns() - stopped_ns < 2.5 * LEASE_S * 1e9:
            degraded_everywhere()
            time.sleep(0.3)
    finally:
        postgres_server.start()
    restarted_ns = time.time_ns()
    assert {code for _, code in answers} == {200}, answers
    counted = runs_counted(fleet, "us-east")
    wait_until(
        lambda: len(probe_starts(ha_store, "us-east")) >= counted,
        "every probe run made during the outage stored",
        timeout_s=10,
        every_s=0.3,
    )
    gap = longest_gap_s(probe_starts(ha_store, "us-east"), stopped_ns, restarted_ns)
    assert gap <= 2 * PROBE_S, f"probing paused {gap:.1f}s during the outage"
    wait_until(
        lambda: all((h := i.health()) is not None and h["store"]["state"] == "ok" for i in fleet),
        "every instance's store writable again",
        timeout_s=10,
    )
    # The store's return ends nothing: through the evaluator's settling and a rule window
    # (`over`) past it, the alert stays firing (no resolution while writes were held).
    wait_until(
        lambda: sum(s > restarted_ns for s in probe_starts(ha_store, "us-east")) >= 8,
        "probe runs for a rule window after the store settled",
        timeout_s=60,
        every_s=0.3,
    )
    assert receiver.statuses("eu-west-lost") == ["firing"], (
        receiver.notifications("eu-west-lost"),
        [(i.base, i.log()[-6000:]) for i in fleet],
    )
    lab_fault(Path(lab["dir"]), "eu-west", "heal")
    wait_until(lambda: "resolved" in receiver.statuses("eu-west-lost"), "resolved", timeout_s=60)
    # One decision each: the evaluator kept its lease through the outage.
    assert receiver.statuses("eu-west-lost") == ["firing", "resolved"]
    wait_until(lambda: gauges_follow_leases(fleet), "gauges on the owners only", timeout_s=30)


@pytest.mark.timeout(300)
def test_an_instance_cut_off_from_postgresql_loses_its_units_and_stops_repairing(
    lab_factory: LabFactory,
    redis_factory: RedisFactory,
    ha_store: str,
    tmp_path: Path,
    fleet: list[Instance],
    receiver: Receiver,
) -> None:
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={})
    a, b = redis_factory("a"), redis_factory("b")
    keys = 4000
    pipe = a.client().pipeline(transaction=False)
    for i in range(keys):
        pipe.set(f"k{i}", f"v{i}")
    pipe.execute()
    data = lab_config(lab, ha_store, receiver)
    data["regions"] += [{"name": "r0", "replicas": [{"name": "n0", "url": a.url}]},
                        {"name": "r1", "replicas": [{"name": "n1", "url": b.url}]}]  # fmt: skip
    data["groups"] = [{"name": "g", "members": ["n0", "n1"]}]
    data["settings"].update(api_token=TOKEN, repair_settle="10ms", repair_rate=100,
                            service_scan_rate=0)  # fmt: skip
    direct = write_config(tmp_path, data)
    pg = urlsplit(ha_store)
    relay = DelayRelay([Link(name="pg", listen_port=0, upstream_port=int(pg.port or 5432))])
    relay.start()
    try:
        relayed_url = ha_store.replace(f":{pg.port}/", f":{relay.links['pg'].listen_port}/")
        data["settings"]["store"] = relayed_url
        relayed = write_config(tmp_path, data, "relayed.toml")
        start(fleet, relayed, tmp_path, 1)
        start(fleet, direct, tmp_path, 2)
        cut, others = fleet[0], fleet[1:]
        wait_until(lambda: work_shared(fleet), "the work shared out", timeout_s=60, every_s=0.3)
        # The instance about to be cut off runs a repair (409 while the scheduled check
        # of g, a slot claimed at start, runs somewhere: ask again).
        answer = repair_accepted(cut.base, timeout_s=120)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["job_id"]
        wait_until(lambda: b.client().dbsize() >= 100, "the repair under way", timeout_s=120)
        owned = next(e["owns"] for e in cut.health()["instances"] if e["this"])  # type: ignore[index]

        relay.command({"op": "partition", "link": "pg"})
        cut_ns = time.time_ns()
        # The others take its units once its leases expire.
        for unit in owned:
            wait_until(
                lambda unit=unit: owner_of(others, unit) in others,
                f"{unit} taken over",
                timeout_s=4 * LEASE_S + 30,
                every_s=0.3,
            )
        # It stops repairing (its group lease cannot be confirmed), and says so.
        wait_until(
            lambda: (
                httpx.get(f"{cut.base}/api/v1/repairs/{job_id}", timeout=10).json()["job"]["state"]
                != "running"
            ),
            "the cut-off instance stops its repair",
            timeout_s=4 * LEASE_S,
            every_s=0.3,
        )
        assert "stopping this run" in cut.log(), cut.log()[-3000:]
        # It still answers, from memory, and names the store.
        health = cut.health()
        assert health is not None and any(p["kind"] == "store" for p in health["problems"])
        # A notification decided while it is cut off is not lost.
        lab_fault(Path(lab["dir"]), "eu-west", "partition")
        wait_until(lambda: "firing" in receiver.statuses("eu-west-lost"), "firing", timeout_s=60)
        lab_fault(Path(lab["dir"]), "eu-west", "heal")
        wait_until(
            lambda: "resolved" in receiver.statuses("eu-west-lost"), "resolved", timeout_s=60
        )
        # Probing went on throughout (the others after the takeover; maybe both for a while).
        gap = longest_gap_s(probe_starts(ha_store, "us-east"), cut_ns, time.time_ns())
        assert gap <= 2 * LEASE_S, f"probing paused {gap:.1f}s"
        # Back: it learns its leases were taken, and each unit has one owner again.
        relay.command({"op": "heal", "link": "pg"})
        wait_until(lambda: gauges_follow_leases(fleet), "gauges follow the leases", timeout_s=60)
        assert "lease lost" in cut.log() or "handed over" in cut.log()
    finally:
        relay.stop()


@pytest.mark.timeout(300)
def test_restarting_instances_one_by_one_leaves_no_unit_unowned(
    lab_factory: LabFactory,
    ha_store: str,
    tmp_path: Path,
    fleet: list[Instance],
    receiver: Receiver,
) -> None:
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={})
    config = write_config(tmp_path, lab_config(lab, ha_store, receiver))
    start(fleet, config, tmp_path, 3)
    wait_until(lambda: work_shared(fleet), "the work shared out", timeout_s=60, every_s=0.3)
    units = {"probe:us-east", "replication", "alerts"}
    unowned_since: dict[str, float] = {}
    longest = dict.fromkeys(units, 0.0)
    stop = threading.Event()
    load_errors: list[str] = []

    def watch_leases() -> None:
        with Store(ha_store) as store:
            while not stop.is_set():
                now = time.monotonic()
                held = {x.name for x in current(store) if x.name in units}
                for unit in units:
                    if unit in held:
                        if unit in unowned_since:
                            gap = now - unowned_since.pop(unit)
                            longest[unit] = max(longest[unit], gap)
                    else:
                        unowned_since.setdefault(unit, now)
                time.sleep(0.05)

    def load() -> None:  # API requests on every live instance meanwhile
        while not stop.is_set():
            for inst in list(fleet):
                if inst.proc.poll() is None:
                    try:
                        httpx.get(inst.base + "/api/v1/lag/matrix", timeout=10)
                    except httpx.TransportError as exc:
                        load_errors.append(str(exc))
            time.sleep(0.05)

    threads = [threading.Thread(target=f, daemon=True) for f in (watch_leases, load)]
    for t in threads:
        t.start()
    try:
        for old in list(fleet[:3]):
            old.stop()
            start(fleet, config, tmp_path, 1)
            wait_until(lambda: work_shared(fleet), "the work shared", timeout_s=60, every_s=0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert not unowned_since, unowned_since
    assert max(longest.values()) <= PROBE_S, longest
