"""After a PostgreSQL outage the evaluator of alerts reads the store again only once every
instance live when it went away has stored what it held: in-process, two instances
(stores and lease keepers) on the suite's PostgreSQL, each through a relay of its own,
so that one stays cut off after the other is back.

The cause of test_ha_outage's second "firing": the instance owning `probe:us-east`
decided and sent the alert from memory during the outage; its held state reached the
store after the evaluator, back first, had waited a fixed 3 s and evaluated without it
(so it fired again, another notification id). Now the evaluator waits for each one's
mark of nothing held (`replag.store.held_marks`), however long it takes it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from replag.config import config_from_dict
from replag.lab.relay import DelayRelay, Link
from replag.lagindex import LagIndex
from replag.metrics import ServiceMetrics
from replag.service.alerting import AlertEvaluation
from replag.service.leasing import LeaseKeeper
from replag.store import Store
from tests.helpers.waiting import wait_until

TTL_S = 30.0  # nothing expires during the test: only the marks decide
OLD_SETTLE_S = 3.0  # the fixed wait this replaces (2 s + probe_interval 1 s)


@pytest.fixture
def relays() -> Iterator[dict[str, DelayRelay]]:
    made: dict[str, DelayRelay] = {}
    yield made
    for relay in made.values():
        relay.stop()


def relayed(url: str, relays: dict[str, DelayRelay], name: str) -> str:
    port = int(urlsplit(url).port or 5432)
    relay = DelayRelay([Link(name="pg", listen_port=0, upstream_port=port)])
    relay.start()
    relays[name] = relay
    return url.replace(f":{port}/", f":{relay.links['pg'].listen_port}/")


def test_the_evaluator_waits_for_what_an_instance_still_cut_off_holds(
    ha_store: str, relays: dict[str, DelayRelay], tmp_path: Path
) -> None:
    evaluator = Store(relayed(ha_store, relays, "a"))
    prober = Store(relayed(ha_store, relays, "p"))
    try:
        a = LeaseKeeper(evaluator, holder="a", ttl_s=TTL_S, units=2)
        p = LeaseKeeper(prober, holder="p", ttl_s=TTL_S, units=2)
        assert a.try_acquire("alerts") is not None
        assert p.try_acquire("probe:us-east") is not None
        for keeper in (a, p, a):
            keeper.heartbeat()  # each sees the other live
        cfg = config_from_dict(
            {"settings": {"store": ha_store, "probe_interval": "1s"},
             "regions": [{"name": "us-east", "write": "redis://127.0.0.1:1"}]},
            where="settling.toml",
        )  # fmt: skip
        evaluation = AlertEvaluation(
            cfg, store=evaluator, index=LagIndex(evaluator), metrics=ServiceMetrics(),
            counters=Counter(),
        )  # fmt: skip
        evaluation.keeper = a

        for relay in relays.values():
            relay.command({"op": "partition", "link": "pg"})
        for keeper in (a, p):
            keeper.renew_all()  # each finds the store away
            assert keeper.away_since() is not None
        # What the prober decided meanwhile (an alert fired and sent from memory) is held.
        decided = time.time_ns()
        held = prober.execute(
            "INSERT INTO alert_events (fingerprint, rule, labels_json, status, at_ns, value, "
            "summary) VALUES ('fp', 'eu-west-lost', '{}', 'firing', ?, 1.0, 'lost')",
            (decided,),
        )
        assert held.deferred

        relays["a"].command({"op": "heal", "link": "pg"})
        wait_until(lambda: evaluator.reachable, "the evaluator's store answers", timeout_s=30)
        a.renew_all()
        a.heartbeat()
        assert a.away_since() is None
        # The prober is still cut off, longer than the fixed wait there was: the evaluator
        # keeps the alert states (it would fire the held alert a second time otherwise).
        back = evaluator.health.reachable_again_mono
        assert back is not None
        time.sleep(max(0.0, back + OLD_SETTLE_S + 0.5 - time.monotonic()))
        why = evaluation.unsettled(a)
        assert why is not None and "(p)" in why, why
        assert not fired_rows(evaluator)

        relays["p"].command({"op": "heal", "link": "pg"})
        wait_until(lambda: prober.health.deferred == 0, "the prober's held writes stored",
                   timeout_s=30)  # fmt: skip
        assert evaluation.unsettled(a) is not None  # stored, not yet marked
        p.renew_all()
        p.heartbeat()  # marks that it holds nothing
        assert evaluation.unsettled(a) is None
        assert fired_rows(evaluator) == [decided]
        # Every instance live before the outage holds its own lease again, and this one
        # marked that it holds nothing: its keeper no longer beats at the outage's pace.
        a.heartbeat()
        assert not a.catching_up()
    finally:
        evaluator.close()
        prober.close()


def fired_rows(store: Store) -> list[int]:
    rows = store.execute("SELECT at_ns FROM alert_events WHERE fingerprint = 'fp'")
    return [int(r.at_ns) for r in rows]
