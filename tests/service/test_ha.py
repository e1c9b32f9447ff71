"""Several `replag serve` processes on one PostgreSQL store: leases, takeover, fencing,
one notification per state change across a failover, a PostgreSQL restart.

Real parts only: the lab's Redis servers and relay, a PostgreSQL the suite starts,
`replag serve` subprocesses, a real webhook receiver. Lease times are short here
(settings); nothing asserts how fast a thing happened except the bound the issue
sets on a takeover (2 × lease_time between probe runs).
"""

from __future__ import annotations

import itertools
import json
import signal
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from replag.lab.cluster import lab_fault
from replag.store import Store
from replag.store.leases import current
from tests.helpers.configs import TOKEN
from tests.helpers.ha import (
    Instance,
    Receiver,
    gauges_follow_leases,
    kill,
    owner_of,
    probe_runs_counted,
    probe_starts,
    repair_accepted,
    start,
    work_shared,
)
from tests.helpers.lab import LabFactory
from tests.helpers.postgres import LocalPostgres
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.waiting import wait_until

LEASE_S = 6.0
FAST = {
    "count": 20,
    "rate": 0,
    "timeout": "2s",
    "probe_interval": "300ms",
    "replication_interval": "1s",
    "check_interval": "1h",
    "lease_time": f"{LEASE_S}s",
}


def write_config(lab: dict[str, Any], tmp_path: Path, url: str, **extra: Any) -> Path:
    data = tomllib.loads((Path(lab["dir"]) / "topology.toml").read_text())
    data.setdefault("settings", {}).update(FAST, store=url)
    data.update(extra)
    path = tmp_path / "replag.toml"
    path.write_text(tomli_w.dumps(data))
    return path


@pytest.mark.timeout(420)  # four scenarios on one set of instances
def test_three_instances_share_the_work_and_survive_kills_and_a_postgresql_restart(
    lab_factory: LabFactory,
    ha_store: str,
    postgres_server: LocalPostgres,
    tmp_path: Path,
    fleet: list[Instance],
    receiver: Receiver,
) -> None:
    """One lab and one set of instances for what needs several running: sharing (each
    unit one owner, its gauges on that owner only), a partition that notifies once and
    resolves once across a SIGKILL of the evaluator, a SIGKILLed probe owner replaced
    within 2 x lease_time with no longer gap, and PostgreSQL restarted under them."""
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={})
    alerts = {
        "repeat_interval": "1h",
        "rules": [{"name": "eu-west-lost", "kind": "probe_loss", "threshold": 0.5, "over": "2s",
                   "target": "eu-west", "no_data": "ok"}],
        "sinks": [{"name": "hook", "kind": "webhook",
                   "url": f"http://127.0.0.1:{receiver.server_address[1]}/"}],
    }  # fmt: skip
    config = write_config(lab, tmp_path, ha_store, alerts=alerts)
    start(fleet, config, tmp_path, 3)

    # Sharing: every unit has one owner; its gauges are exported there only.
    wait_until(lambda: owner_of(fleet, "probe:us-east") is not None, "a probe owner", timeout_s=60)
    owned = [u for entry in fleet[0].health()["instances"] for u in entry["owns"]]  # type: ignore[index]
    assert len(owned) == len(set(owned))
    wait_until(lambda: gauges_follow_leases(fleet), "gauges on the owners only", timeout_s=60)

    # A partition: one firing, one resolved, across a SIGKILL of the evaluating instance.
    wait_until(lambda: owner_of(fleet, "alerts") is not None, "an evaluator", timeout_s=60)
    lab_fault(Path(lab["dir"]), "eu-west", "partition")
    wait_until(lambda: receiver.statuses("eu-west-lost") == ["firing"], "firing", timeout_s=90)
    with Store(ha_store) as store:  # delivered, and marked so in the outbox
        wait_until(
            lambda: not store.execute("SELECT id FROM alert_outbox WHERE delivered_ns IS NULL"),
            "the outbox drained",
        )
    evaluator = owner_of(fleet, "alerts")
    assert evaluator is not None
    kills = [(kill(evaluator), evaluator.base)]  # (when, which instance)
    survivors = [i for i in fleet if i.proc.poll() is None]
    wait_until(
        lambda: owner_of(survivors, "alerts") in survivors,
        "a survivor evaluates",
        timeout_s=4 * LEASE_S + 30,
        every_s=0.5,
    )
    lab_fault(Path(lab["dir"]), "eu-west", "heal")
    wait_until(
        lambda: receiver.statuses("eu-west-lost")[:2] == ["firing", "resolved"],
        "resolved",
        timeout_s=90,
        every_s=0.3,
    )

    # The owner of a region's probe killed: another probes it within 2 x lease_time.
    wait_until(lambda: len(probe_starts(ha_store, "us-east")) >= 5, "probe runs", timeout_s=60)
    victim = owner_of(survivors, "probe:us-east")
    assert victim is not None
    killed_ns = kill(victim)
    kills.append((killed_ns, victim.base))
    wait_until(
        lambda: any(s > killed_ns for s in probe_starts(ha_store, "us-east")),
        "another instance probes us-east",
        timeout_s=4 * LEASE_S + 30,
        every_s=0.3,
    )
    starts = probe_starts(ha_store, "us-east")
    longest_gap_s = max(b - a for a, b in itertools.pairwise(starts)) / 1e9
    assert longest_gap_s <= 2 * LEASE_S, f"lag series gap of {longest_gap_s:.1f}s"
    # The dead instances leave the list; a new one joins (two run from here on).
    start(fleet, config, tmp_path, 1)
    assert all(str(victim.pid) not in json.dumps(i.health()["instances"])  # type: ignore[index]
               for i in fleet if i.proc.poll() is None)  # fmt: skip

    # PostgreSQL restarted under the two running instances: they go on, nothing is lost.
    before = probe_starts(ha_store, "us-east")
    postgres_server.restart()
    restarted_ns = time.time_ns()
    wait_until(
        lambda: any(s > restarted_ns for s in probe_starts(ha_store, "us-east")),
        "probing goes on after the restart",
        timeout_s=90,
        every_s=0.5,
    )
    assert set(before) <= set(probe_starts(ha_store, "us-east"))
    assert all(i.health() is not None for i in fleet if i.proc.poll() is None)
    # Nothing was sent twice: the partition's firing and resolution once each (a replica
    # catching up after the heal may lose probes again: a new episode, with a start of
    # its own, is not a repeat); the evaluator's lease handed over to share the work
    # never makes two instances send one. The one exception is what docs/ha.md says: an
    # owner SIGKILLed after its request and before its delivered mark, whose notification
    # the next owner sends again, with the same notificationId.
    sent = receiver.notifications("eu-west-lost")
    ids: dict[tuple[str, str], set[str]] = {}
    copies: dict[str, list[tuple[int, str]]] = {}
    for status, starts, notification_id, at, sender in sent:
        ids.setdefault((status, starts), set()).add(notification_id)
        copies.setdefault(notification_id, []).append((at, sender))
    # On failure, say who sent again (adoptions) and who stood back (claims refused).
    outbox = [line for i in fleet for line in i.log().splitlines()
              if "adopted under epoch" in line or "notifications not sent" in line]  # fmt: skip
    assert all(len(one) == 1 for one in ids.values()), (sent, outbox)  # one decision, one id
    for received in copies.values():
        # A second copy only from another instance, after the first copy's sender was killed.
        assert len(received) == 1 or (
            len(received) == 2
            and received[1][1] != received[0][1]
            and any(received[0][0] < k < received[1][0] and who == received[0][1]
                    for k, who in kills)
        ), (sent, kills, outbox)  # fmt: skip


def test_an_instance_paused_past_its_lease_writes_and_notifies_nothing(
    lab_factory: LabFactory, ha_store: str, tmp_path: Path, fleet: list[Instance]
) -> None:
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={})
    # Long probe runs (2 s of writes): the pause most likely lands between two writes.
    config = write_config(lab, tmp_path, ha_store)
    data = tomllib.loads(config.read_text())
    data["settings"].update(count=40, rate=20)
    config.write_text(tomli_w.dumps(data))
    start(fleet, config, tmp_path, 2)
    # The first instance up takes every unit, then gives some up to the second: pause the
    # probe's owner once that is done (else it may have given the probe away meanwhile).
    wait_until(lambda: work_shared(fleet), "the work shared out", timeout_s=90, every_s=0.3)
    wait_until(lambda: owner_of(fleet, "probe:us-east") is not None, "a probe owner", timeout_s=60)
    paused = owner_of(fleet, "probe:us-east")
    assert paused is not None
    other = next(i for i in fleet if i is not paused)
    wait_until(lambda: probe_runs_counted(paused, "us-east") >= 1, "a first run", timeout_s=60)
    time.sleep(0.5)  # inside the next run's writes
    with Store(ha_store) as store:
        [held] = current(store, prefix="probe:us-east")
    # Read last, right before the pause (opening a store takes seconds on a busy host): the
    # runs stored until then. Not its run counter: once resumed it may take the probe back
    # under a new epoch (the work shared out again) and count runs of its own, rightly.
    stored_before = probe_starts(ha_store, "us-east")
    paused.proc.send_signal(signal.SIGSTOP)
    stopped_ns = time.time_ns()
    try:
        wait_until(
            lambda: any(s > stopped_ns for s in probe_starts(ha_store, "us-east")),
            "the other instance takes over",
            timeout_s=4 * LEASE_S + 30,
            every_s=0.3,
        )
        assert owner_of([other], "probe:us-east") is other
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    resumed_ns = time.time_ns()
    wait_until(lambda: paused.health() is not None, "the paused instance answers again")
    # Its loops wake and find their fences gone.
    wait_until(
        lambda: "no longer held" in (log := paused.log()) or "lease lost" in log,
        "the paused instance stops its run",
        timeout_s=4 * LEASE_S + 30,
    )
    time.sleep(LEASE_S / 2)  # a result it still stored would be in by now
    # The run it was in when paused (started before the pause) never stored its results.
    assert [s for s in probe_starts(ha_store, "us-east") if s <= stopped_ns] == stored_before
    # Every run stored since the resume is the new owner's (one run at a time).
    starts = [s for s in probe_starts(ha_store, "us-east") if s > resumed_ns]
    assert all(b > a for a, b in itertools.pairwise(starts))
    # The work may be shared out again, even the probe back to the resumed instance: but
    # only under a later epoch than the one it was paused with, never its old lease.
    with Store(ha_store) as store:
        wait_until(lambda: bool(current(store, prefix="probe:us-east")), "the probe owned")
        [now] = current(store, prefix="probe:us-east")
    assert now.epoch > held.epoch
    # What it lost it no longer exports: each gauge is on its unit's owner only.
    wait_until(lambda: gauges_follow_leases(fleet), "gauges follow the leases", timeout_s=60)


def test_a_repair_whose_instance_is_killed_is_resumed_by_another(
    redis_factory: RedisFactory, ha_store: str, tmp_path: Path, fleet: list[Instance]
) -> None:
    a, b = redis_factory("a"), redis_factory("b")
    keys = 3000
    pipe = a.client().pipeline(transaction=False)
    for i in range(keys):
        pipe.set(f"k{i}", f"v{i}")
    pipe.execute()
    data = {
        "settings": {**FAST, "store": ha_store, "api_token": TOKEN, "repair_settle": "10ms",
                     "repair_rate": 200, "service_scan_rate": 0},
        "regions": [{"name": "r0", "replicas": [{"name": "n0", "url": a.url}]},
                    {"name": "r1", "replicas": [{"name": "n1", "url": b.url}]}],
        "groups": [{"name": "g", "members": ["n0", "n1"]}],
    }  # fmt: skip
    config = tmp_path / "replag.toml"
    config.write_text(tomli_w.dumps(data))
    start(fleet, config, tmp_path, 2)
    first, second = fleet
    answer = repair_accepted(first.base, timeout_s=240)
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["job_id"]

    def job_row() -> Any:
        with Store(ha_store) as store:
            rows = store.execute("SELECT * FROM service_jobs WHERE id = ?", (job_id,))
        return rows[0] if rows else None

    # Killed part-way: some keys repaired, not all.
    wait_until(
        lambda: (row := job_row()) is not None and row.run_id and b.client().dbsize() >= 200,
        "the repair under way",
        timeout_s=300,
        every_s=0.1,
    )
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    assert b.client().dbsize() < keys
    run_id = job_row().run_id
    wait_until(
        lambda: (row := job_row()) is not None and row.state != "running",
        "another instance finishes the job",
        timeout_s=4 * LEASE_S + 180,
        every_s=0.5,
    )
    row = job_row()
    assert row.state == "done", row
    assert row.resumed == 1 and row.owner != "" and str(first.pid) not in row.owner
    assert row.run_id == run_id  # the same run, resumed from its checkpoint
    assert "resuming run" in second.log()
    assert b.client().dbsize() == keys
    assert all(b.client().get(f"k{i}") == f"v{i}".encode() for i in range(0, keys, 97))
