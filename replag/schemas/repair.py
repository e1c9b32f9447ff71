"""Schemas of `replag repair check|run|runs|rebuild --json`."""

from __future__ import annotations

from replag.schemas.parts import (
    BOOL,
    INT,
    NUM,
    SCHEMA_VERSION,
    STR,
    arr,
    counts,
    mapping,
    nullable,
    obj,
)

KIND_COUNTS = counts("missing", "type", "value", "ttl")
# The same keys in the per-member vocabulary: some member lacks it (missing), the
# reference (primary, or most members) lacks it (extra), or value/type/expiry differ.
FOUND_COUNTS = counts("missing", "extra", "different")

REPAIR_REPLICA = obj(
    {"replica": STR, "keys_scanned": INT, "keys_per_s": NUM, "busy_s": NUM, "writes": INT},
    {"region": nullable(STR), "via": STR, "bytes_fetched": INT, "group": STR, "scan_s": NUM},
)

# Per member of a group: what differs there against the group's reference (the primary,
# or the state a majority holds), and what the run did or, dry, would do about it.
PER_REPLICA = mapping(counts("missing", "extra", "different", "copy", "delete", "leave"))

# Per key outcome (see replag.repair.decisions.report): the group's counts use the singular
# "conflict" and "error", the run's totals "conflicts" and "errors".
_OUTCOMES = ("repaired", "busy", "kept", "would_repair", "agreed", "pending", "resync")

# Keys every member holds as a value replag cannot read whole (a module type), by type:
# how many, why, and the first few by name. Their presence, type and expiry were
# compared; a run with any is NOT CLEAN.
NOT_COMPARED = arr(
    obj(
        {
            "type": STR,
            "keys": INT,
            "why": STR,
            "examples": arr(obj({"key": STR}, {"key_b64": STR})),
        }
    )
)

REPAIR_GROUP = obj(
    {"group": STR, "divergent": INT, "counts": KIND_COUNTS},
    {
        "kind": {"enum": ["replication", "dynomite", "peers"]},
        "kind_why": STR,
        "primary": nullable(STR),
        "policy": nullable(STR),
        "per_replica": PER_REPLICA,
        "found": FOUND_COUNTS,
        # Redis Cluster: [first, last] slot ranges that moved during the run, not compared.
        "slots_not_compared": arr(arr(INT)),
        # Redis Cluster: keys a member holds in slots the shard does not serve (a reshard's
        # leftovers on a replica), by the group serving them: where, and a few named.
        "stray_keys": arr(
            obj(
                {
                    "member": STR,
                    "keys": INT,
                    "slots": arr(arr(INT)),
                    "served_by": STR,
                    "served_at": STR,
                    "examples": arr(obj({}, {"key": STR, "key_b64": STR})),
                },
                # Held by the shard's primary (a move into the shard left half-done), not
                # by a replica (a reshard's leftovers).
                # origin: replica (a reshard's leftovers), unfinished_move (marked importing
                # on the primary), promoted (a primary that held them as a replica), unknown.
                {
                    "on_primary": BOOL,
                    "origin": {"enum": ["replica", "unfinished_move", "promoted", "unknown"]},
                },
            )
        ),
        # Redis Cluster on Valkey 8+ / Redis 8.2+ (CLUSTER SLOT-STATS): per replica, the
        # slots whose key count differs from its primary's, a signal beside the findings
        # (equal counts do not prove equal content); exact: read at one replication
        # offset, else named only if the same at two reads (unconfirmed: the others).
        "slot_counts": arr(
            obj(
                {
                    "member": STR,
                    "primary": STR,
                    "slots_differing": INT,
                    "key_difference": INT,
                    "replica_minus_primary": INT,
                    "slots": arr(arr(INT)),
                    "examples": arr(obj({"slot": INT, "primary": INT, "replica": INT})),
                    "exact": BOOL,
                    "unconfirmed": INT,
                }
            )
        ),
        # ... or the answer of a server without the command (not compared).
        "slot_counts_missing": nullable(STR),
        # Redis Cluster: migrating/importing marks with no move under way (a mark on a
        # replica its primary no longer has, or naming a node that is not a live primary):
        # their slots were compared.
        "stale_marks": arr(obj({"node": STR, "slots": arr(arr(INT))})),
        # Redis Cluster: moves marked on both ends (live primaries) during which no key
        # left the migrating node (a reshard interrupted): their slots were compared.
        "stuck_moves": arr(
            obj(
                {
                    "migrating": STR,
                    "importing": STR,
                    "slots": arr(arr(INT)),
                    "keys_migrating": INT,
                    "keys_importing": INT,
                }
            )
        ),
        # Valkey 9: atomic slot migrations that moved slots during the run.
        "slot_migrations": arr(
            obj({"slots": arr(arr(INT)), "source": STR, "target": STR, "state": STR})
        ),
        # Redis Cluster: why the members are no longer the configured shard (rediscover).
        "topology_changed": nullable(STR),
        # Reads a member refused (NOPERM) that the verdict depends on: not verified.
        "refused": arr(STR),
        "candidates": INT,
        "bulk_refilled": INT,
        "changing_during_check": INT,
        "not_compared": NOT_COMPARED,
        "undone": INT,
        "undo_failed": INT,
        "reverified": INT,
        "differed_again": INT,
        **dict.fromkeys(_OUTCOMES, INT),
        "conflict": INT,
        "error": INT,
        "scan_s": NUM,
        "repair_s": NUM,
        "replicas": arr(REPAIR_REPLICA),
        "bytes_by_region": mapping(INT),
    },
)

# One member's state of a key: absent, present (type, digest, remaining TTL), or in a
# Cluster slot that moved while it was read (exists null, moved).
KEY_STATE = obj(
    {"exists": nullable(BOOL)},
    {
        "moved": BOOL,
        "type": STR,
        "digest": nullable(STR),
        "ttl_ms": nullable(INT),
        "fields_with_ttl": INT,  # a hash's fields that have a TTL
        # Why this value could not be read whole (a module type): not compared.
        "not_compared": STR,
    },
)

DIVERGENT_KEY = obj(
    {"kind": {"enum": ["missing", "type", "value", "ttl"]}, "replicas": mapping(KEY_STATE)},
    {
        "key": STR,
        "key_b64": STR,
        "group": STR,
        "status": STR,
        "reason": STR,
        # member name → missing | extra | different; and → copy | delete (the decision)
        "findings": mapping({"enum": ["missing", "extra", "different"]}),
        "plan": mapping({"enum": ["copy", "delete"]}),
        "via": STR,  # the primary a replication group's write was made on
        # kind ttl of a hash whose fields' TTLs differ: how many, and up to ten names
        "fields": obj({"differing": INT, "named": arr(STR)}),
    },
)

REPAIR_REPORT = obj(
    {
        "run_id": STR,
        "kind": {"enum": ["check", "repair"]},
        "status": STR,
        "group": nullable(STR),
        "policy": nullable(STR),
        "dry_run": BOOL,
        "allow_deletes": BOOL,
        "ttls": {"enum": ["compare", "ignore"]},
        "divergent": INT,
        "counts": KIND_COUNTS,
        **dict.fromkeys(
            (
                "repaired",
                "conflicts",
                "busy",
                "undone",
                "undo_failed",
                "reverified",
                "differed_again",
                "kept",
                "would_repair",
                "agreed",
            ),
            INT,
        ),
        "groups": arr(REPAIR_GROUP),
        "divergent_keys_total": INT,
    },
    {
        "seconds": NUM,
        "scan_rate": nullable(NUM),
        # Databases holding keys on a compared server that no group covers (not checked).
        "unchecked_databases": arr(
            obj({"member": STR, "address": STR, "db": INT, "keys": INT}, {"cluster": BOOL})
        ),
        # A read refused, or a topology changed under the run: exit 3, never clean.
        "not_verified": BOOL,
        "pending": INT,
        "found": FOUND_COUNTS,
        "replicas": arr(REPAIR_REPLICA),
        "divergent_keys": arr(DIVERGENT_KEY),
        "error": nullable(STR),
        # Keys a server refused to write (READONLY, NOPERM, OOM…), and keys only a resync
        # of a replica can fix (replication groups).
        "errors": INT,
        "resync": INT,
        "not_compared": NOT_COMPARED,
        "not_compared_total": INT,
    },
)

CHECK = obj({"schema_version": {"const": SCHEMA_VERSION}}, REPAIR_REPORT["properties"])
CHECK["required"] = ["schema_version", *REPAIR_REPORT["required"]]

# What a check or repair run was asked (the store keeps it; a resume reads it back).
RUN_PARAMS = obj(
    {"kind": {"enum": ["check", "repair"]}, "group": nullable(STR)},
    {
        "policy": nullable(STR),
        "dry_run": BOOL,
        "allow_deletes": BOOL,
        "rate": nullable(NUM),
        "max_inflight": INT,
        "match": nullable(STR),
        "type_filter": nullable(STR),
        "ttls": {"enum": ["compare", "ignore"]},
        # Who started it through the API (token name, client address, job id).
        "started_by": nullable(mapping(STR)),
    },
)

REBUILD_PARAMS = obj(
    {"group": STR, "replica": STR},
    {
        "source": nullable(STR),
        "rate": nullable(NUM),
        "closing_pass": BOOL,
        # A whole `repair run` after the copy, not only the keys the copy left.
        "full_closing_pass": BOOL,
    },
)

REBUILD_REPORT = obj(
    {
        "run_id": STR,
        "kind": {"const": "rebuild"},
        "status": STR,
        "plan": obj(
            {
                "group": STR,
                "target": STR,
                "source": STR,
                "peers": arr(STR),
                "source_keys": INT,
                "target_keys": INT,
                "keys": INT,
                "bytes_estimate": INT,
                "rate": nullable(NUM),
                "eta_s": nullable(NUM),
            },
            {"rate_note": STR},
        ),
        **dict.fromkeys(
            (
                "keys_read",
                "copied",
                "big_copied",
                "bytes_copied",
                "present",
                "disagree",
                "gone",
                "changed",
                "undo_failed",
                "expired",
                "settled_on_resume",
                "keys_per_s",
            ),
            INT,
        ),
        "seconds": NUM,
        "closing": nullable({"type": "object"}),
        "closing_s": NUM,
    },
    # Keys the closing pass verified (those the copy left); null: every key (a full pass).
    {"closing_keys": nullable(INT)},
)

REBUILD = obj({"schema_version": {"const": SCHEMA_VERSION}}, REBUILD_REPORT["properties"])
REBUILD["required"] = ["schema_version", *REBUILD_REPORT["required"]]


RUNS = obj(
    {
        "schema_version": {"const": SCHEMA_VERSION},
        "store": STR,
        "runs": arr(
            obj(
                {
                    "run_id": STR,
                    "kind": {"enum": ["check", "repair", "rebuild"]},
                    "status": STR,
                    "started": NUM,
                    "finished": nullable(NUM),
                    "error": nullable(STR),
                    "resume": nullable(STR),
                },
                {
                    "params": {"anyOf": [RUN_PARAMS, REBUILD_PARAMS]},
                    # The run's report without its key and replica lists (a rebuild's:
                    # its counts); null until it ends.
                    "report": {"anyOf": [REPAIR_REPORT, REBUILD_REPORT, {"type": "null"}]},
                    # The instance running it, its last heartbeat (UTC s, the store's clock),
                    # and for a run still "running", whether that owner is alive.
                    "owner": nullable(STR),
                    "heartbeat": nullable(NUM),
                    "owner_alive": nullable(BOOL),
                },
            )
        ),
    }
)
