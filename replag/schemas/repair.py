"""Schemas of `replag repair check|run|runs|rebuild --json`."""

from __future__ import annotations

from replag.schemas.parts import BOOL, INT, NUM, SCHEMA_VERSION, STR, arr, counts, nullable, obj

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
PER_REPLICA = {
    "type": "object",
    "additionalProperties": counts("missing", "extra", "different", "copy", "delete", "leave"),
}

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
    },
)

DIVERGENT_KEY = obj(
    {"kind": STR, "replicas": {"type": "object"}},
    {
        "key": STR,
        "key_b64": STR,
        "group": STR,
        "status": STR,
        "reason": STR,
        # member name → missing | extra | different; and → copy | delete (the decision)
        "findings": {"type": "object", "additionalProperties": STR},
        "plan": {"type": "object", "additionalProperties": STR},
        "via": STR,  # the primary a replication group's write was made on
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
        "found": FOUND_COUNTS,
        "replicas": arr(REPAIR_REPLICA),
        "divergent_keys": arr(DIVERGENT_KEY),
        "error": nullable(STR),
        # Keys a server refused to write (READONLY, NOPERM, OOM…), and keys only a resync
        # of a replica can fix (replication groups).
        "errors": INT,
        "resync": INT,
    },
)

CHECK = obj({"schema_version": {"const": SCHEMA_VERSION}}, REPAIR_REPORT["properties"])
CHECK["required"] = ["schema_version", *REPAIR_REPORT["required"]]

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
                    "params": {"type": "object"},
                    "report": nullable({"type": "object"}),
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


REBUILD = obj(
    {
        "schema_version": {"const": SCHEMA_VERSION},
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
            }
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
    }
)
