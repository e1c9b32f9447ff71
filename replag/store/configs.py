"""Which configs a store serves: one, unless the user shares it on purpose.

Two configs pointed at one store (a hand-written file keeping the old default
path, two discovered files edited alike) would show each other's shards, runs
and alerts as their own. `replag serve` records its config here and refuses a
store another config's `serve` used, naming it, unless `settings.store_shared`.
"""

from __future__ import annotations

import time

from replag.errors import ConfigError
from replag.store.base import Store


def claim_for_config(store: Store, config: str, *, shared: bool, where: str) -> None:
    """Record that `config` (its file's resolved path) uses `store`; ConfigError when
    another config did and the store is not `shared` (`where`: the store, as shown)."""
    rows = store.execute("SELECT config FROM store_configs ORDER BY first_ns")
    others = [str(r.config) for r in rows if r.config != config]
    if others and not shared:
        raise ConfigError(
            f"the store {where} holds the data of another config ({', '.join(others)}): "
            "give this config a store of its own (settings.store), or set "
            "store_shared = true in both to share it on purpose"
        )
    now = time.time_ns()
    store.execute(
        "INSERT INTO store_configs (config, first_ns, last_ns) VALUES (?, ?, ?) "
        "ON CONFLICT (config) DO UPDATE SET last_ns = excluded.last_ns",
        (config, now, now),
    )
