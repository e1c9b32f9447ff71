"""The pieces every output schema is built of, and the replication state they share."""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1

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
    """An object with exactly these fields: one the schema does not name is refused, so
    a field added to an output without its schema fails the contract tests (a consumer
    still ignores what it does not know; `schema_version` is raised only when a field
    is removed or changes meaning)."""
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
        "additionalProperties": False,
    }


def open_obj(required: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    """An object with these fields and possibly others: only where the shape is not
    replag's to fix (the lab's state file, printed as it is kept)."""
    return {**obj(required, optional), "additionalProperties": True}


def mapping(values: Schema) -> Schema:
    """An object whose keys are names (replicas, regions, URLs), each holding `values`."""
    return {"type": "object", "additionalProperties": values}


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
        "read_only": nullable(BOOL),
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
        "resyncs": nullable(
            obj({}, dict.fromkeys(("full", "partial_ok", "partial_err"), nullable(INT)))
        ),
        "offset_moved_during_read": INT,
        "backlog": nullable(
            obj({}, dict.fromkeys(("size", "first_byte_offset", "histlen"), nullable(INT)))
        ),
    },
)

REPLICATION = obj(
    {"primaries": arr(PRIMARY_STATE), "notes": arr(STR)},
    {"commands": INT, "duration_ms": NUM},
)
