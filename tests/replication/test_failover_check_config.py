"""`failover_check` reads what it needs of the config at its entry (the topology, the
timeout, the probe interval): finding the primaries and assessing them get those values,
never the `Config` (`tests.helpers.config_trail` follows it through a real run). Before,
it went on to `primaries_now` and `assess_primaries`.
"""

from __future__ import annotations

from pathlib import Path

from replag.discovery.primaries import failover_check
from tests.helpers.config_trail import follow, probe_config
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed


async def test_a_failover_checks_config_stops_at_its_entry(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    primary = redis_factory("primary")
    replica = replica_of(redis_factory, primary, "replica")
    wait_listed(primary, [replica])
    config = probe_config(tmp_path, primary, [replica])
    with follow(config) as (trail,):
        answer = await failover_check(config)
    assert answer.assessments, answer
    assert trail.places == ["replag.discovery.primaries:failover_check"], trail.summary()
