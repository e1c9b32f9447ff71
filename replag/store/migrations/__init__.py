"""The store's schema history: every migration shipped, in order (see `replag.store.schema`).

A new table or column is a new module here with the next number, added to the
list below; one that has shipped is never edited.
"""

from __future__ import annotations

from replag.store.migrations import (
    m0001_initial,
    m0002_leases_and_run_owners,
    m0003_rebuilds,
    m0004_service_ha,
    m0005_outbox_claims,
    m0006_store_configs,
    m0007_replica_state_columns,
    m0008_instance_stored,
)
from replag.store.schema import Migration, numbered

MIGRATIONS: tuple[Migration, ...] = tuple(
    numbered(
        [
            m0001_initial,
            m0002_leases_and_run_owners,
            m0003_rebuilds,
            m0004_service_ha,
            m0005_outbox_claims,
            m0006_store_configs,
            m0007_replica_state_columns,
            m0008_instance_stored,
        ]
    )
)


def latest_version() -> int:
    return len(MIGRATIONS)
