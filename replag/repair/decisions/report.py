"""What a check or repair run found and did: `RepairReport`, its dict and its table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replag.plural import count, plural
from replag.repair.decisions.not_compared import EXAMPLES
from replag.repair.trees.diff import KINDS

KEYS_SHOWN = 100
# The text report names every key a run acted on when there are at most this many.
KEYS_NAMED = 10
# A divergent key in the vocabulary of the per-member table (see `findings`).
KEY_FINDINGS = ("missing", "extra", "different")

# Per-key outcomes recorded in the store (repair_keys.status).
FOUND = "found"  # check runs: divergent, nothing attempted
PENDING = "pending"  # repair runs: not handled yet
REPAIRED = "repaired"
CONFLICT = "conflict"
BUSY = "busy"  # kept changing through every recheck round: left alone, not guessed
KEPT = "kept"  # policy wanted a delete that --allow-deletes did not allow
DRY_RUN = "would_repair"
AGREED = "agreed"  # replicas agreed by the time we came to repair it
ERROR = "error"  # a server refused the key's read or write (READONLY, NOPERM, OOM…)
# Replication groups: a replica the primary's write does not reach (link down, another
# primary, or it did not follow within repair_settle): only a resync fixes it.
RESYNC = "resync"
OUTCOMES = (REPAIRED, CONFLICT, BUSY, KEPT, DRY_RUN, AGREED, PENDING, ERROR, RESYNC)
# Outcomes that leave a key divergent.
LEFT = (CONFLICT, BUSY, KEPT, PENDING, ERROR, RESYNC)


def key_finding(kind: str, detail: dict[str, Any]) -> str:
    """A divergent key in the members' vocabulary: `extra` when the reference lacks it
    (every member that differs holds it), `missing` when some member lacks it, else
    `different` (value, type or expiry)."""
    if kind != "missing":
        return "different"
    found = set(detail.get("findings", {}).values())
    return "extra" if found == {"extra"} else "missing"


def _slot_count_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per replica whose key count differs from its primary's in some slots: where, by how
    much, and what that does and does not say."""
    lines: list[str] = []
    for row in rows:
        if not row["slots_differing"]:
            continue
        named = ", ".join(
            f"{e['slot']} ({e['primary']} vs {e['replica']})" for e in row["examples"]
        )
        more = ", …" if row["slots_differing"] > len(row["examples"]) else ""
        how = "at one replication offset" if row["exact"] else "the same at two reads"
        lines.append(
            f"  slot counts: {row['member']} differs from {row['primary']} in "
            f"{count(row['slots_differing'], 'slot')}, {count(row['key_difference'], 'key')} "
            f"({row['replica_minus_primary']:+d} on the replica; {how}): "
            f"slot (primary vs replica) {named}{more}"
        )
        if row["unconfirmed"]:
            lines.append(
                f"    {row['unconfirmed']} more {plural('slot', row['unconfirmed'])} differed at "
                "one read only "
                "(writes in flight): not named"
            )
    return lines


def _stray_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Keys in slots the shard does not serve: where, who serves the slots, what fixes them."""
    lines = []
    for row in rows:
        slots = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in row["slots"])
        named = ", ".join(repr(k.get("key", k.get("key_b64"))) for k in row["examples"])
        lines.append(
            f"  {row['member']} holds {count(row['keys'], 'key')} in slots this shard does not "
            "serve: "
            f"{slots} (served by {row['served_by']}, {row['served_at']}); e.g. {named}"
        )
        lines.append("    " + _stray_advice(row))
    return lines


def _stray_advice(row: dict[str, Any]) -> str:
    """Where a member's stray keys came from, and what removes them without bringing a
    deleted key back."""
    member, origin = (
        row["member"],
        row.get("origin", "replica" if not row.get("on_primary") else "unknown"),
    )
    unread = f"clients never read them ({member} answers MOVED)"
    if origin == "replica":
        return (
            f"left by a reshard (MIGRATE moves the primary's keys only); {unread} and this "
            f"shard's primary cannot delete them: a full resync of {member} removes them"
        )
    if origin == "unfinished_move":
        # MIGRATE brought them here and the slot stayed elsewhere (a move into this shard
        # that did not finish, its other end failed over, say).
        return (
            f"left by a slot move into this shard that did not finish; {unread}: `redis-cli "
            f"--cluster fix {member}` (valkey-cli on Valkey) moves them to the slot's owner "
            "while the slot is still marked importing here"
        )
    if origin == "promoted":
        return (
            f"inherited: {member} held them as a replica (a reshard moves only the primary's "
            "keys; its primary then had deleted them or never held them) and was promoted "
            f"since; {unread}. Do not move them (`redis-cli --cluster fix` would bring deleted "
            f"keys back on the slot's owner): delete them on {member} (per slot `CLUSTER "
            "SETSLOT <slot> IMPORTING <owner id>`, then `ASKING` and `DEL` on the same "
            "connection, then `CLUSTER SETSLOT <slot> STABLE`)"
        )
    return (
        f"held by the primary with no move open here; {unread}: if a move into this shard "
        f"brought them, `redis-cli --cluster fix {member}` moves them to the slot's owner; "
        "if they were deleted elsewhere, delete them here instead (per slot `CLUSTER SETSLOT "
        "<slot> IMPORTING <owner id>`, then `ASKING` and `DEL`, then `CLUSTER SETSLOT <slot> "
        "STABLE`)"
    )


def _migration_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Valkey 9 atomic slot migrations that moved slots during the run, by range."""
    return [
        f"  slot migration (CLUSTER MIGRATESLOTS) during the run: "
        f"{', '.join(f'{a}-{b}' if a != b else str(a) for a, b in m['slots'])} from "
        f"{m['source']} to {m['target']} ({m['state']})"
        for m in rows
    ]


def _stuck_line(move: dict[str, Any]) -> str:
    """A move marked on both ends that did not move a key during the run: what it is, and
    what clears it (finishing it when the importing end holds keys already)."""
    slots = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in move["slots"])
    first = move["slots"][0][0]
    if move["keys_importing"]:
        fix = (
            f"finish it with `redis-cli --cluster fix {move['migrating']}` (valkey-cli on "
            "Valkey), which moves the keys left"
        )
    else:
        fix = (
            f"`CLUSTER SETSLOT {first} STABLE` (each slot) on {move['migrating']} and "
            f"{move['importing']}, or finish it with `redis-cli --cluster fix`"
        )
    return (
        f"  stuck slot move: {slots} marked migrating on {move['migrating']} and importing on "
        f"{move['importing']}, and no key moved during the run "
        f"({count(move['keys_migrating'], 'key')} left there, {move['keys_importing']} moved): "
        "not a live move (a reshard "
        f"interrupted, by a failover say), so compared; if no reshard is running, {fix}"
    )


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "kB", "MB"):
        if value < 1000:
            return f"{value:,.0f} B" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1000
    return f"{value:,.1f} GB"


@dataclass
class ReplicaStats:
    replica: str
    keys_scanned: int = 0
    scan_s: float = 0.0
    busy_s: float = 0.0
    writes: int = 0
    region: str | None = None
    via: str = "scan"  # or "agent": compared through its region's agent
    bytes_fetched: int = 0  # bytes received from the replica or its agent

    @property
    def keys_per_s(self) -> float:
        return self.keys_scanned / self.scan_s if self.scan_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "keys_scanned": self.keys_scanned,
            "scan_s": round(self.scan_s, 3),
            "keys_per_s": round(self.keys_per_s),
            "busy_s": round(self.busy_s, 3),
            "writes": self.writes,
            "region": self.region,
            "via": self.via,
            "bytes_fetched": self.bytes_fetched,
        }


@dataclass
class GroupReport:
    group: str
    replicas: list[ReplicaStats]
    kind: str = "peers"  # how the run treated the group: replication, dynomite, peers
    kind_why: str = ""  # how that was decided (configured, or the roles read)
    primary: str | None = None  # a replication group's primary when the run started
    policy: str | None = None  # the policy that decided (repair runs)
    # Per member: missing, extra, different; copy, delete, leave (see `findings`).
    per_replica: dict[str, dict[str, int]] = field(default_factory=dict)
    # Redis Cluster: slots that moved (or were migrating) during the check: their keys
    # were not compared, and nothing found in them is reported.
    slots_not_compared: list[tuple[int, int]] = field(default_factory=list)
    # Redis Cluster: keys members hold in slots the shard does not serve (`stray_slots`).
    stray_keys: list[dict[str, Any]] = field(default_factory=list)
    # Redis Cluster on Valkey 8+ / Redis 8.2+: per replica, the slots whose key count
    # differs from its primary's (`slot_counts`); a signal beside the findings.
    slot_counts: list[dict[str, Any]] = field(default_factory=list)
    # ... or why they were not compared (the server has no CLUSTER SLOT-STATS).
    slot_counts_missing: str | None = None
    # Redis Cluster: migrating/importing marks with no move under way (their slots were
    # compared): {node, slots}.
    stale_marks: list[dict[str, Any]] = field(default_factory=list)
    # Redis Cluster: moves marked on both ends during which no key moved (their slots
    # were compared): {migrating, importing, slots, keys_migrating, keys_importing}.
    stuck_moves: list[dict[str, Any]] = field(default_factory=list)
    # Valkey 9: atomic slot migrations (CLUSTER MIGRATESLOTS) that moved slots during the
    # run: {slots, source, target, state}.
    slot_migrations: list[dict[str, Any]] = field(default_factory=list)
    # Redis Cluster: why the group's members are no longer the shard the config names
    # (nothing of the group is reported then: rediscover).
    topology_changed: str | None = None
    # Reads a member refused (NOPERM) that the verdict depends on: the run is not verified.
    refused: list[str] = field(default_factory=list)
    candidates: int = 0
    changing: int = 0
    # Keys every member holds as a value replag cannot read (a module type), by type:
    # {type, keys, why, examples} (`not_compared`).
    not_compared: list[dict[str, Any]] = field(default_factory=list)
    undone: int = 0  # target writes put back because the winner moved before they stood
    undo_failed: int = 0  # keys whose copy a client changed in place before the undo
    reverified: int = 0  # keys a resumed run read again because it had repaired them
    differed_again: int = 0  # ... and found differing again (repaired again or reported)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    # The same keys as `counts`, as missing (some member lacks it), extra (the reference
    # lacks it: the primary, or most members) or different (value, type or expiry).
    found: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KEY_FINDINGS, 0))
    outcomes: dict[str, int] = field(default_factory=dict)
    keys: list[dict[str, Any]] = field(default_factory=list)
    scan_s: float = 0.0
    repair_s: float = 0.0
    # Missing keys copied by the bulk path (`bulk`): in counts and outcomes, not listed.
    bulk_refilled: int = 0

    @property
    def divergent(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "kind": self.kind,
            "kind_why": self.kind_why,
            "primary": self.primary,
            "policy": self.policy,
            "divergent": self.divergent,
            "counts": dict(self.counts),
            "found": dict(self.found),
            "candidates": self.candidates,
            "bulk_refilled": self.bulk_refilled,
            "changing_during_check": self.changing,
            "not_compared": self.not_compared,
            "undone": self.undone,
            "undo_failed": self.undo_failed,
            "reverified": self.reverified,
            "differed_again": self.differed_again,
            **{o: self.outcomes.get(o, 0) for o in OUTCOMES},
            "scan_s": round(self.scan_s, 3),
            "repair_s": round(self.repair_s, 3),
            "replicas": [r.to_dict() for r in self.replicas],
            "per_replica": self.per_replica,
            "slots_not_compared": [list(r) for r in self.slots_not_compared],
            "stray_keys": self.stray_keys,
            "slot_counts": self.slot_counts,
            "slot_counts_missing": self.slot_counts_missing,
            "stale_marks": self.stale_marks,
            "stuck_moves": self.stuck_moves,
            "slot_migrations": self.slot_migrations,
            "topology_changed": self.topology_changed,
            "refused": self.refused,
            "bytes_by_region": self.bytes_by_region(),
        }

    def bytes_by_region(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.replicas:
            region = r.region or "-"
            out[region] = out.get(region, 0) + r.bytes_fetched
        return out


@dataclass
class RepairReport:
    """A run's result. `to_dict()` is what the API returns and the store keeps."""

    run_id: str
    kind: str
    group: str | None
    policy: str | None
    dry_run: bool
    allow_deletes: bool
    status: str
    groups: list[GroupReport]
    seconds: float = 0.0
    # Keys per second each replica's scan was held to (None: as fast as it goes).
    scan_rate: float | None = None
    # "compare" or "ignore": whether expiries were compared (settings.repair_ttls).
    ttls: str = "compare"
    # Databases holding keys on a compared server that no group covers: not looked at.
    unchecked_databases: list[dict[str, Any]] = field(default_factory=list)

    @property
    def divergent(self) -> int:
        return sum(g.divergent for g in self.groups)

    @property
    def not_clean(self) -> bool:
        """Something is wrong beyond the divergent keys, or not known to be right: a
        database with keys no group covers, keys left in slots their shard does not
        serve, keys whose values could not be compared."""
        return (
            bool(self.unchecked_databases)
            or any(g.stray_keys for g in self.groups)
            or self.not_compared_keys > 0
        )

    @property
    def not_compared_keys(self) -> int:
        return sum(row["keys"] for g in self.groups for row in g.not_compared)

    def not_compared(self) -> list[dict[str, Any]]:
        """Every group's keys not compared, by type (their counts added, names merged)."""
        by_type: dict[str, dict[str, Any]] = {}
        for g in self.groups:
            for row in g.not_compared:
                mine = by_type.setdefault(row["type"], {**row, "keys": 0, "examples": []})
                mine["keys"] += row["keys"]
                mine["examples"] = (mine["examples"] + row["examples"])[:EXAMPLES]
        return [by_type[name] for name in sorted(by_type)]

    @property
    def not_verified(self) -> bool:
        """The run could not see all it needed to vouch for its verdict: a read refused
        (NOPERM), or a group whose topology changed under it (exit 3, never clean)."""
        return any(g.refused or g.topology_changed for g in self.groups)

    def _total(self, outcome: str) -> int:
        return sum(g.outcomes.get(outcome, 0) for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        keys = [dict(k, group=g.group) for g in self.groups for k in g.keys]
        return {
            "run_id": self.run_id,
            "kind": self.kind,
            "status": self.status,
            "group": self.group,
            "policy": self.policy,
            "dry_run": self.dry_run,
            "allow_deletes": self.allow_deletes,
            "seconds": round(self.seconds, 3),
            "scan_rate": self.scan_rate,
            "ttls": self.ttls,
            "divergent": self.divergent,
            "counts": {k: sum(g.counts[k] for g in self.groups) for k in KINDS},
            "found": {k: sum(g.found.get(k, 0) for g in self.groups) for k in KEY_FINDINGS},
            "repaired": self._total(REPAIRED),
            "conflicts": self._total(CONFLICT),
            "busy": self._total(BUSY),
            "undone": sum(g.undone for g in self.groups),
            "undo_failed": sum(g.undo_failed for g in self.groups),
            "reverified": sum(g.reverified for g in self.groups),
            "differed_again": sum(g.differed_again for g in self.groups),
            "kept": self._total(KEPT),
            "errors": self._total(ERROR),
            "resync": self._total(RESYNC),
            "would_repair": self._total(DRY_RUN),
            "agreed": self._total(AGREED),
            "pending": self._total(PENDING),
            "replicas": [dict(r.to_dict(), group=g.group) for g in self.groups for r in g.replicas],
            "groups": [g.to_dict() for g in self.groups],
            "divergent_keys": keys[:KEYS_SHOWN],
            "divergent_keys_total": self.divergent,
            "unchecked_databases": self.unchecked_databases,
            "not_verified": self.not_verified,
            "not_compared": self.not_compared(),
            "not_compared_total": self.not_compared_keys,
        }

    def render(self) -> str:
        """The human report: counts by kind, outcomes, per-replica throughput."""
        d = self.to_dict()
        title = f"{self.kind} {self.run_id}: {d['status']}"
        if self.policy and self.kind == "repair":
            title += f", policy {self.policy}" + (", dry run" if self.dry_run else "")
        if self.ttls == "ignore":
            title += ", TTLs not compared"
        lines = [
            title,
            "",
            "keys (missing: some replica lacks it; extra: a replica holds it, the primary or "
            "most do not; different: value, type or expiry)",
            f"{'group':<14} {'missing':>8} {'extra':>8} {'different':>10} "
            f"{'repaired':>9} {'conflicts':>10} {'busy':>8}",
        ]
        for g in self.groups:
            gd = g.to_dict()
            lines.append(
                f"{g.group:<14} {g.found['missing']:>8} {g.found['extra']:>8} "
                f"{g.found['different']:>10} {gd[REPAIRED]:>9} "
                f"{gd[CONFLICT]:>10} {gd[BUSY]:>8}"
            )
        extras = [
            f"{name.replace('_', ' ')} {d[name]}"
            for name in (
                "would_repair",
                "kept",
                "errors",
                "resync",
                "agreed",
                "pending",
                "undone",
                "undo_failed",
            )
            if d[name]
        ]
        changing = sum(g.changing for g in self.groups)
        if changing and self.kind == "check":
            extras.append(f"{changing} changing while read (being written; not compared)")
        if d["reverified"]:
            extras.append(
                f"resumed: {count(d['reverified'], 'key')} repaired before read again, "
                f"{d['differed_again']} differed again"
            )
        if extras:
            lines.append("also: " + ", ".join(extras))
        lines += [
            "",
            f"{'replica':<24} {'via':>6} {'keys':>10} {'keys/s':>10} {'busy s':>8} "
            f"{'writes':>7} {'fetched':>10}",
        ]
        for g in self.groups:
            for r in g.replicas:
                rate = f"{r.keys_per_s:>10,.0f}" if r.via == "scan" else f"{'-':>10}"
                lines.append(
                    f"{r.replica:<24} {r.via:>6} {r.keys_scanned:>10} {rate} "
                    f"{r.busy_s:>8.2f} {r.writes:>7} {_size(r.bytes_fetched):>10}"
                )
        lines += self._per_replica()
        lines += self._acted_on(d)
        left = [(g.group, k) for g in self.groups for k in g.keys if k.get("status") in LEFT]
        if left:
            lines += ["", "not fixed (first 10; --json lists up to 100, --keys-out all):"]
            for group, k in left[:KEYS_NAMED]:
                name = k.get("key", k.get("key_b64", "?"))
                reason = f": {k['reason']}" if k.get("reason") else ""
                lines.append(f"  {group} {name!r} {k['kind']} {k['status']}{reason}")
        lines += self._unchecked()
        lines += self._not_compared_lines()
        lines += self._slot_counts_missing()
        done = f"{count(self.divergent, 'divergent key')} in {self.seconds:.1f} s"
        if self.unchecked_databases:
            n = len(self.unchecked_databases)
            done += f"; NOT CLEAN: {count(n, 'database')} holding keys were not checked (above)"
        strays = sum(row["keys"] for g in self.groups for row in g.stray_keys)
        if strays:
            done += (
                f"; NOT CLEAN: {count(strays, 'key')} in slots their shard does not serve (above)"
            )
        if self.not_verified:
            done += "; NOT VERIFIED: the check could not see everything it needs (above)"
        if self.not_compared_keys:
            done += (
                f"; NOT CLEAN: {count(self.not_compared_keys, 'key')} whose values could not be "
                "compared (above)"
            )
        lines += ["", done]
        return "\n".join(lines)

    def _slot_counts_missing(self) -> list[str]:
        """Said once a run, with the first group's reason: groups whose slot counts were
        not compared (a server without CLUSTER SLOT-STATS, or a user refused it)."""
        missing = [g.slot_counts_missing for g in self.groups if g.slot_counts_missing]
        if not missing:
            return []
        groups = count(len(missing), "group")
        return ["", f"slot counts not compared in {groups}: {missing[0]}"]

    def _not_compared_lines(self) -> list[str]:
        rows = self.not_compared()
        if not rows:
            return []
        lines = [
            "",
            "not compared: keys every member holds as a value replag cannot read whole "
            "(presence, type and expiry compared; values not):",
        ]
        for row in rows:
            named = ", ".join(repr(k["key"]) for k in row["examples"])
            more = ", …" if row["keys"] > len(row["examples"]) else ""
            lines.append(
                f"  {row['type']}: {count(row['keys'], 'key', fmt=',')} ({row['why']}): "
                f"{named}{more}"
            )
        return lines

    def _unchecked(self) -> list[str]:
        if not self.unchecked_databases:
            return []
        lines = ["", "not checked: databases that hold keys and that no group covers:"]
        for u in self.unchecked_databases:
            lines.append(f"  {u['member']} ({u['address']}) db{u['db']}: {u['keys']:,} keys")
        if any(u.get("cluster") for u in self.unchecked_databases):
            lines.append(
                "  discover again (`replag topology discover --cluster URL --out FILE` writes "
                "a group per database that holds keys on each shard's primary), or add a "
                "group for each: a member's url names its database, redis://host:port/N"
            )
        else:
            lines.append(
                "  add a group for each (`replag topology discover` writes one per database "
                "that holds keys; a member's url names its database: redis://host:port/N)"
            )
        return lines

    def _acted_on(self, d: dict[str, Any]) -> list[str]:
        """The keys a repair wrote (a dry run: would write), by name when few; else where
        to find them all."""
        if self.kind != "repair":
            return []
        done = REPAIRED if not self.dry_run else DRY_RUN
        total = int(d[done])
        if not total:
            return []
        verb = "would repair" if self.dry_run else "repaired"
        named = [(g.group, k) for g in self.groups for k in g.keys if k.get("status") == done]
        if total > KEYS_NAMED or len(named) < total:
            return [
                "",
                f"{verb} {count(total, 'key')}: --keys-out FILE lists each, with what was done",
            ]
        lines = ["", f"{verb}:"]
        for group, k in named:
            name = k.get("key", k.get("key_b64", "?"))
            planned = ", ".join(f"{a} on {m}" for m, a in sorted(k.get("plan", {}).items()))
            via = f" (through {k['via']})" if k.get("via") else ""
            what = key_finding(k["kind"], k)
            lines.append(f"  {group} {name!r} {what}: {planned or 'written'}{via}")
        return lines

    def _per_replica(self) -> list[str]:
        """Per group, how it was treated, and per member what differs there and what the
        run did (a dry run: would do) about it."""
        lines: list[str] = []
        dry = "would " if self.dry_run else ""
        for g in self.groups:
            how = f"group {g.group}: {g.kind}"
            if g.primary:
                how += f", primary {g.primary}"
            if g.policy and self.kind == "repair":
                how += f", policy {g.policy}"
            lines += ["", how + (f" ({g.kind_why})" if g.kind_why else "")]
            if g.slots_not_compared:
                moved = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in g.slots_not_compared)
                lines.append(
                    f"  slots not compared (a live move during the run; check again): {moved}"
                )
            for mark in g.stale_marks:
                slots = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in mark["slots"])
                lines.append(
                    f"  stale slot mark on {mark['node']}: {slots} marked migrating/importing "
                    "with no move under way (compared; clear it with `CLUSTER SETSLOT <slot> "
                    "STABLE` on that node, or on a replica's primary, which Valkey passes on)"
                )
            lines += [_stuck_line(m) for m in g.stuck_moves]
            lines += _migration_lines(g.slot_migrations)
            lines += _stray_lines(g.stray_keys)
            lines += _slot_count_lines(g.slot_counts)
            if g.topology_changed:
                lines.append(
                    f"  topology changed: {g.topology_changed}; nothing of this group is "
                    "reported: rediscover (`replag topology discover --cluster URL --out FILE`)"
                )
            lines += [f"  not verified: {r}" for r in g.refused]
            if g.refused:
                lines.append(
                    "    the ACL user lacks what the check needs here; `replag acl --mode "
                    "check --user NAME` prints every rule (`--check -c CONFIG` tries them)"
                )
            if not g.divergent:
                continue
            head = f"  {'replica':<24} {'missing':>8} {'extra':>8} {'different':>10}"
            if self.kind == "repair":
                head += f"   {dry}copy, {dry}delete, left"
            lines.append(head)
            for name, c in g.per_replica.items():
                row = f"  {name:<24} {c['missing']:>8} {c['extra']:>8} {c['different']:>10}"
                if self.kind == "repair":
                    row += f"   {c['copy']}, {c['delete']}, {c['leave']}"
                lines.append(row)
        return lines
