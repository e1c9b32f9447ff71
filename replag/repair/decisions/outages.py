"""Which replicas the probes saw cut off: what a Dynomite group's majority policy must know.

Under DC_ONE a rack that is cut off misses writes and deletes alike, and nothing
replays them. When at most one rack was cut off, the other racks' majority holds
every write; when two or more were, a majority may have missed the same write,
and the majority's word is no longer evidence. The probes' record says which: a
lag window with lost probes means that replica missed writes in that window.
"""

from __future__ import annotations

from replag.store import Store


def cut_off_replicas(store: Store, since_ns: int) -> set[str]:
    """Replicas with a lost probe in any lag window ending at or after `since_ns`."""
    rows = store.execute(
        "SELECT DISTINCT replica FROM lag_windows WHERE end_ns >= ? AND lost > 0", (since_ns,)
    )
    return {str(row[0]) for row in rows}
