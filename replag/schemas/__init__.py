"""JSON Schemas of what `--json` prints: the contract a cron job or a monitoring system reads.

Every document carries `schema_version` (an integer, raised when a field is removed or
changes meaning; a new field may appear without it). Objects whose shape replag decides
refuse fields their schema does not name, so the schema is always the whole contract.
`replag schema NAME` prints a schema; tests validate real outputs against them.
"""

from __future__ import annotations

from typing import Any

from replag.schemas.operations import DYNOMITE_STATS, LAB_UP
from replag.schemas.parts import INT, SCHEMA_VERSION, STR, Schema, obj
from replag.schemas.probe import FAILOVER_CHECK, PROBE, SAMPLE
from replag.schemas.repair import CHECK, REBUILD, RUNS

__all__ = ["LINES", "SCHEMAS", "SCHEMA_VERSION", "Schema", "schema", "versioned"]

DIALECT = "https://json-schema.org/draft/2020-12/schema"

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
    "dynomite-stats": (
        "`replag topology dynomite-stats --json`: every node's /info figures, and the "
        "nodes whose peers dropped writes",
        DYNOMITE_STATS,
    ),
    "lab-up": ("`replag lab up --json`: the lab's processes and links", LAB_UP),
    "samples": (
        "`replag probe --samples-out FILE`: one line of the JSON Lines file, one probe "
        "write on one replica",
        SAMPLE,
    ),
}
# Outputs written line by line, not as one `--json` document: no error alternative
# (a failed run writes no file), each line validated on its own.
LINES = {"samples"}


def schema(name: str) -> Schema:
    """The full JSON Schema document of one output (KeyError for an unknown name)."""
    title, body = SCHEMAS[name]
    head = {
        "$schema": DIALECT,
        "$id": f"urn:replag:schema:{name}:v{SCHEMA_VERSION}",
        "title": title,
    }
    if name in LINES:
        return {**head, "description": "One line of the file (JSON Lines).", **body}
    return {
        **head,
        "description": "The command's result, or (exit code 2) the error that stopped it.",
        "anyOf": [body, ERROR],
    }


def versioned(document: dict[str, Any]) -> dict[str, Any]:
    """The document with `schema_version` first, as every `--json` output carries it."""
    return {"schema_version": SCHEMA_VERSION, **document}
