"""JSON Schemas of what `--json` prints: the contract a cron job or a monitoring system reads.

Every document carries `schema_version` (an integer, raised when a field is removed or
changes meaning; new fields may appear without it, so objects allow extra properties).
`replag schema NAME` prints a schema; tests validate real outputs against them.
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1
DIALECT = "https://json-schema.org/draft/2020-12/schema"

Schema = dict[str, Any]

STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
ANY: Schema = {}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def arr(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def obj(required: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    """An object with these fields (extra fields allowed: a consumer ignores what it
    does not know)."""
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
    }


def counts(*names: str) -> Schema:
    return obj(dict.fromkeys(names, INT))


PERCENTILES = obj({k: nullable(NUM) for k in ("mean", "p50", "p90", "p99", "p999", "max")})

REPLICA_STATE = obj(
    {
        "replica": STR,
        "region": STR,
        "status": STR,
        "link_up": nullable(BOOL),
        "bytes_behind": nullable(INT),
        "bytes_uncertainty": nullable(INT),
        "backlog_headroom": nullable(INT),
        "headroom_fraction": nullable(NUM),
        "error": nullable(STR),
    },
    {
        "address": STR,
        "link_status": nullable(STR),
        "last_io_s": nullable(NUM),
        "link_down_s": nullable(NUM),
        "sync_in_progress": nullable(BOOL),
        "offset": nullable(INT),
        "read_offset": nullable(INT),
        "ack_offset": nullable(INT),
        "ack_lag_s": nullable(NUM),
        "priority": nullable(INT),
        "loading": BOOL,
    },
)

PRIMARY_STATE = obj(
    {
        "source": STR,
        "primary": STR,
        "offset": nullable(INT),
        "replicas": arr(REPLICA_STATE),
        "error": nullable(STR),
    },
    {
        "address": STR,
        "read_skew_ms": nullable(NUM),
        "write_rate_bps": nullable(NUM),
        "replid": nullable(STR),
        "resyncs": nullable(obj({}, dict.fromkeys(("full", "partial_ok", "partial_err"), INT))),
        "backlog": nullable(obj({}, {"size": nullable(INT)})),
    },
)

REPLICATION = obj(
    {"primaries": arr(PRIMARY_STATE), "notes": arr(STR)},
    {"commands": INT, "duration_ms": NUM},
)

PAIR = obj(
    {
        "source": STR,
        "target": STR,
        "replica": STR,
        "sent": INT,
        "seen": INT,
        "lost": INT,
        "loss_ratio": NUM,
        "lag_ms": PERCENTILES,
        "uncertainty_ms": obj({"p50": nullable(NUM), "max": nullable(NUM)}),
        "out_of_range": INT,
        "consistency": nullable(STR),
        "observed_by": STR,
        "negative": counts("count", "beyond_uncertainty"),
        "error": nullable(STR),
        "replication": nullable(obj({})),
        "excluded": obj({"count": INT, "because": nullable({"enum": ["syncing", "loading"]})}),
    },
)

BREACH = obj(
    {"kind": STR, "message": STR},
    {"source": STR, "target": STR, "replica": STR, "consistency": nullable(STR)},
)

UNREACHABLE = obj({"region": STR, "replica": STR, "error": STR})

PROBE = obj(
    {
        "schema_version": {"const": SCHEMA_VERSION},
        "run_id": STR,
        "source": STR,
        "write_endpoint": STR,
        "mode": {"enum": ["auto", "push", "poll"]},
        "consistency": nullable(STR),
        "cluster_consistency": nullable(obj({})),
        "started": {"type": "string", "format": "date-time"},
        "duration_s": NUM,
        "pairs": arr(PAIR),
        "write_ms": obj({"count": INT, "errors": INT}),
        "clock": arr(obj({"endpoint": STR, "offset_ms": NUM, "uncertainty_ms": NUM})),
        "agents": arr(obj({"region": STR, "agent": STR, "replicas": arr(STR)})),
        "unreachable": arr(UNREACHABLE),
        "breaches": arr(BREACH),
        "notes": arr(STR),
        "replication": nullable(REPLICATION),
        "failovers": arr(obj({})),
    },
    {
        "dynomite_seed": arr(obj({})),
        "write_ms_by_consistency": {"type": "object"},
    },
)

KIND_COUNTS = counts("missing", "type", "value", "ttl")

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

CANDIDATE = obj(
    {
        "replica": STR,
        "region": STR,
        "status": STR,
        "rpo_bytes": nullable(INT),
        "rpo_s": nullable(NUM),
        "eligible": BOOL,
        "reason": nullable(STR),
    },
    {"rpo_s_from": nullable(STR)},
)

FAILOVER_CHECK = obj(
    {
        "schema_version": {"const": SCHEMA_VERSION},
        "safe": BOOL,
        "primaries": arr(
            obj(
                {
                    "source": STR,
                    "primary": STR,
                    "safe": BOOL,
                    "verdict": STR,
                    "safest": nullable(STR),
                    "rpo_bytes": nullable(INT),
                    "rpo_s": nullable(NUM),
                    "candidates": arr(CANDIDATE),
                },
                {"max_bytes": INT, "max_lag_s": nullable(NUM)},
            )
        ),
        "replication": REPLICATION,
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

# What `--json` prints instead when the command failed (exit 2: usage, config, connection).
ERROR = obj(
    {"schema_version": {"const": SCHEMA_VERSION}, "error": STR, "exit_code": INT},
    {"run_id": STR},
)

SCHEMAS: dict[str, tuple[str, Schema]] = {
    "probe": ("`replag probe --json`: one probe run (or several sources' runs)", PROBE),
    "check": ("`replag repair check --json`", CHECK),
    "repair": ("`replag repair run --json`", CHECK),
    "failover-check": ("`replag failover-check`", FAILOVER_CHECK),
    "runs": ("`replag repair runs --json`: recent runs, newest first", RUNS),
    "rebuild": ("`replag repair rebuild --json`: a rebuild's plan and what it did", REBUILD),
}


def schema(name: str) -> Schema:
    """The full JSON Schema document of one output (KeyError for an unknown name)."""
    title, body = SCHEMAS[name]
    return {
        "$schema": DIALECT,
        "$id": f"urn:replag:schema:{name}:v{SCHEMA_VERSION}",
        "title": title,
        "description": "The command's result, or (exit code 2) the error that stopped it.",
        "anyOf": [body, ERROR],
    }


def versioned(document: dict[str, Any]) -> dict[str, Any]:
    """The document with `schema_version` first, as every `--json` output carries it."""
    return {"schema_version": SCHEMA_VERSION, **document}
