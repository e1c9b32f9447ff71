"""`store_configs`: the configs whose `serve` used this store (by the config file's path).

A store holds one config's lag windows, runs and alert state unless shared on purpose
(`settings.store_shared`): `replag serve` on another config refuses it rather than
show two fleets' data as one (`replag.store.configs`).
"""

from __future__ import annotations

from replag.store.schema import Step

STEPS: tuple[Step, ...] = (
    """CREATE TABLE IF NOT EXISTS store_configs (
        config TEXT PRIMARY KEY,
        first_ns INTEGER NOT NULL,
        last_ns INTEGER NOT NULL
    )""",
)
