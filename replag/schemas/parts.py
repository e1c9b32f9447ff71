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
