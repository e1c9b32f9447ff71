"""One check or repair per replica group at a time, across processes sharing a store.

A run takes the lease `repair:GROUP` of every group it covers before it starts
(`replag.store.leases`: expiry on the database's clock, renewal scoped to the
holder), renews it every quarter of `settings.lease_time`, and gives it up when
it ends. A second run of the same group, from the CLI or any service instance,
on SQLite or PostgreSQL, is refused naming the holder; a holder that died leaves
a lease that expires after `lease_time`.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence

from replag.errors import JobConflict, StoreError
from replag.store import Store, leases
from replag.store.leases import Lease, instance_id

log = logging.getLogger(__name__)
LEASE_S = 20.0  # when no settings say (tests, library callers)


def lease_name(group: str) -> str:
    return f"repair:{group}"


def take_groups(store: Store, groups: Sequence[str], *, ttl_s: float = LEASE_S) -> list[Lease]:
    """Lease every group in `groups` for this process, or none: JobConflict naming the
    holder when another process holds one."""
    taken: list[Lease] = []
    me = instance_id()
    for group in groups:
        lease = leases.acquire(store, lease_name(group), holder=me, ttl_s=ttl_s)
        if lease is None and _expire_if_dead(store, lease_name(group)):
            lease = leases.acquire(store, lease_name(group), holder=me, ttl_s=ttl_s)
        if lease is None:
            release_groups(store, taken)
            holder = next(
                (x.holder for x in leases.current(store, prefix=lease_name(group))
                 if x.name == lease_name(group)),
                "another process",
            )  # fmt: skip
            raise JobConflict(
                f"a check or repair of group {group} is already running (held by {holder})"
            )
        taken.append(lease)
    return taken


def _expire_if_dead(store: Store, name: str) -> bool:
    """End `name`'s lease now if its holder is a process of this host that no longer runs
    (a run killed a moment ago, resumed at once): True when it did."""
    for lease in leases.current(store, prefix=name):
        host, _, rest = lease.holder.partition(":")
        pid_text = rest.partition(":")[0]
        if lease.name != name or host != socket.gethostname() or not pid_text.isdigit():
            continue
        if _alive(int(pid_text)):
            return False
        store.execute(
            "UPDATE leases SET expires_ns = 0 WHERE name = ? AND holder = ? AND epoch = ?",
            (name, lease.holder, lease.epoch),
        )
        log.info("%s: its holder %s is no longer running; taken over", name, lease.holder)
        return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def renew_groups(store: Store, held: list[Lease], *, ttl_s: float = LEASE_S) -> list[Lease]:
    """Renew `held`; raise JobConflict if one was lost (the run must stop)."""
    renewed = []
    for lease in held:
        again = leases.renew(store, lease, ttl_s=ttl_s)
        if again is None:
            raise JobConflict(f"lost the lease on {lease.name}: another process took it over")
        renewed.append(again)
    return renewed


def release_groups(store: Store, held: Sequence[Lease]) -> None:
    for lease in held:
        try:
            leases.release(store, lease)
        except StoreError as exc:
            log.warning("%s: not released (%s); it expires by itself", lease.name, exc)
