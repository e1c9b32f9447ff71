"""A run's config stops at the run's entry: the steps read the run's state, not the config.

`tests.helpers.config_trail` follows the `Config` handed to `repair.check`,
`repair.repair` and `rebuild` through every replag function that receives it, or an
object that holds it (a run-state object, a bound method, a closure, up to `DEPTH`
steps down). Before the run state travelled as one object, a check's config went
through 31 places and came back 11 to 13 times to a module it had left (engine ↔
group_run ↔ trees.remote ↔ scan.process ↔ writes.verify), a repair's through 36 with
18 returns, a rebuild's through 16 with a return per batch copied; the settings went
the same way. Now: 3, 3 and 4 places, no return; the settings, 12 to 13 places (they had
grown back to 26-37 when GroupRun kept the settings for a wiped member's refill: it keeps
`RebuildOptions` now).
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.config_trail import run_trails
from tests.helpers.redis_servers import RedisFactory

MAX_PLACES = 15
MAX_RETURNS = 2


async def test_a_runs_config_goes_through_few_places(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = [redis_factory("t") for _ in range(3)]
    clients = [s.client() for s in servers]
    for client in clients:
        client.mset({f"k{i}": "v" for i in range(50)})
    clients[2].set("k1", "other")
    clients[2].set("only-c", "x")
    # The repair writes the majority's values to c; the rebuild refills it, wiped.
    for kind in ("check", "repair", "rebuild"):
        if kind == "rebuild":
            assert clients[2].get("k1") == b"v"
            clients[2].delete(*[f"k{i}" for i in range(50)], "only-c")
        trail, settings = await run_trails(tmp_path, servers, kind=kind)
        assert len(trail.places) <= MAX_PLACES, trail.summary()
        assert trail.returns <= MAX_RETURNS, trail.summary()
        # Nor do the settings: below a group's run, the steps get narrow options (scan,
        # page, refill and rebuild options), so GroupRun itself holds no settings.
        assert len(settings.places) <= MAX_PLACES, settings.summary()
    assert clients[2].get("k1") == b"v"
