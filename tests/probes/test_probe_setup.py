"""A probe run's config stops at its entry: `run_probe` takes a `ProbeSetup` (the topology,
the run's settings, the agents' token) from it once, and the probe's parts get that or
narrower values (`tests.helpers.config_trail` follows the config through a real run).
Before, the config went through 11 places and came back 3 times to a module it had left
(runner ↔ replication.alongside ↔ measure: following the shard, the Sentinel, the
targets, the agents' watches); now 3, no return.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.config_trail import probe_trail
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed

MAX_PLACES = 3


async def test_a_probes_config_goes_through_few_places(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    primary = redis_factory("primary")
    replica = replica_of(redis_factory, primary, "replica")
    wait_listed(primary, [replica])
    trail = await probe_trail(tmp_path, primary, [replica])
    assert len(trail.places) <= MAX_PLACES, trail.summary()
    assert trail.returns == 0, trail.summary()
    assert not any(
        p.startswith(("replag.probes.measure", "replag.replication")) for p in trail.places
    )
