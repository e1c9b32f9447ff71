"""Periodic work claimed per time slot: one row per (unit, slot), inserted by one instance.

The slot is `floor(database time / interval)`, on the database's clock only.
`INSERT … ON CONFLICT DO NOTHING RETURNING`: the instance whose insert returns
a row runs that slot; the others see nothing returned and skip it. No scheduler
is elected, and an instance that lost its way (paused, partitioned) can at
worst claim a slot nobody else ran.
"""

from __future__ import annotations

import time

from replag.store import Store


class SlotClaims:
    def __init__(self, store: Store, *, holder: str) -> None:
        self.store = store
        self.holder = holder  # table: migration m0003

    def claim(self, name: str, interval_s: float) -> bool:
        """Claim the current slot of `name`; True when this instance is the one to run it."""
        interval_ns = max(1, int(interval_s * 1e9))
        rows = self.store.execute(
            f"""INSERT INTO slot_claims (name, slot, holder, claimed_ns)
                SELECT ?, now_ns / ?, ?, now_ns
                FROM (SELECT {self.store.now_ns_sql} AS now_ns) t WHERE true
                ON CONFLICT (name, slot) DO NOTHING RETURNING slot""",
            (name, interval_ns, self.holder),
        )
        return bool(rows)

    def prune(self, *, older_than_s: float = 86_400.0) -> int:
        cutoff = time.time_ns() - int(older_than_s * 1e9)
        rows = self.store.execute(
            "DELETE FROM slot_claims WHERE claimed_ns < ? RETURNING name", (cutoff,)
        )
        return len(rows)
