"""Which configs a store serves: one, unless the user shares it on purpose.

Two configs pointed at one store (a hand-written file keeping the old default
path, two discovered files edited alike) would show each other's shards, runs
and alerts as their own. `replag serve` records its config here and refuses a
store another config's `serve` used, naming it, unless `settings.store_shared`; so
does every CLI run that writes into it (`repair check|run`, `probe`, `rebuild`, `topology
dynomite-stats`): `open_config_store`.

A config file moved or renamed is not "another config": on a SQLite store (one host's
file, so every claimant's path is on this host) a claim whose file no longer exists is
released, with a warning naming it, and the new path takes its place. A PostgreSQL
store is shared by hosts whose files this host cannot see, so there a claim is released
only by hand (`DELETE FROM store_configs WHERE config = ...`) or by sharing on purpose.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from replag.errors import ConfigError
from replag.store.base import Store
from replag.store.location import parse_location

if TYPE_CHECKING:
    from replag.config import Config

log = logging.getLogger(__name__)


def claim_for_config(
    store: Store, config: str, *, shared: bool, where: str, local: bool = False
) -> None:
    """Record that `config` (its file's resolved path) uses `store`; ConfigError when
    another config did and the store is not `shared` (`where`: the store, as shown).
    `local`: every claimant is on this host (a SQLite store), so a claim whose file is
    gone (moved, renamed, deleted) is released rather than refused."""
    rows = store.execute("SELECT config FROM store_configs ORDER BY first_ns")
    others = [str(r.config) for r in rows if r.config != config]
    if local and not shared:
        gone = [other for other in others if not Path(other).exists()]
        for other in gone:
            store.execute("DELETE FROM store_configs WHERE config = ?", (other,))
            log.warning(
                "the store %s was claimed by %s, which no longer exists (moved or "
                "deleted?): %s takes it over",
                where,
                other,
                config,
            )
        others = [other for other in others if other not in gone]
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


def claim_config_store(store: Store, config: Config) -> None:
    """`claim_for_config` for a loaded config (one read from no file claims nothing)."""
    if config.path is None:
        return
    location = parse_location(config.settings.store)
    claim_for_config(
        store,
        str(config.path.expanduser().resolve()),
        shared=config.settings.store_shared,
        where=location.shown,
        local=location.backend == "sqlite",
    )


def open_config_store(config: Config) -> Store:
    """`config`'s store, claimed for it: ConfigError (one line, exit 2) when it holds
    another config's data and neither shares it on purpose."""
    store = Store(config.settings.store)
    try:
        claim_config_store(store, config)
    except BaseException:
        store.close()
        raise
    return store
