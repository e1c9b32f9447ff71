"""Schemas of `replag probe --json` and `replag failover-check`."""

from __future__ import annotations

from replag.schemas.parts import (
    BOOL,
    INT,
    NUM,
    PERCENTILES,
    REPLICATION,
    SCHEMA_VERSION,
    STR,
    arr,
    counts,
    nullable,
    obj,
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

# One line of `replag probe --samples-out FILE` (JSON Lines): one probe write seen (or
# lost) on one replica, with its bar and how it was stamped (docs/lag.md).
SAMPLE = obj(
    {
        "schema_version": {"const": SCHEMA_VERSION},
        "key": STR,
        "seq": INT,
        "source": STR,
        "target": STR,
        "replica": STR,
        "lag_ms": nullable(NUM),
        "uncertainty_ms": nullable({"type": "number", "minimum": 0}),
        "mode": {"enum": ["push", "poll"]},
        "agent": BOOL,
        "stamp": nullable({"enum": ["kernel", "loop", "chunk-placed", "widened"]}),
        "widened_ms": {"type": "number", "minimum": 0},
        "write_rtt_ms": {"type": "number", "minimum": 0},
        "write_stamp": {"enum": ["kernel", "loop"]},
    },
)
