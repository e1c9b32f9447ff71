"""Schemas of `replag probe --json` and `replag failover-check`."""

from __future__ import annotations

from replag.schemas.parts import (
    BOOL,
    INT,
    NUM,
    PERCENTILES,
    REPLICA_STATE,
    REPLICATION,
    SCHEMA_VERSION,
    STR,
    arr,
    counts,
    mapping,
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
        "excluded": obj({"count": INT, "because": nullable({"enum": ["syncing", "loading"]})}),
    },
    {
        # The replica's replication state sampled at the end of the run (replication
        # groups and Cluster shards; null where there is none, e.g. Dynomite).
        "replication": nullable(REPLICA_STATE),
        "rack": nullable(STR),  # Dynomite: the replica's rack
        # How the seen samples were stamped → how many (`replag schema samples`, `stamp`).
        "stamps": {
            "type": "object",
            "propertyNames": {"enum": ["kernel", "loop", "chunk-placed", "widened"]},
            "additionalProperties": INT,
        },
    },
)

BREACH = obj(
    {"kind": {"enum": ["unreachable", "write_errors", "p99", "loss"]}, "message": STR},
    {
        "source": STR,
        "target": STR,
        "replica": STR,
        "consistency": nullable(STR),
        "value": NUM,  # loss: the ratio; write_errors: the count
        "limit": NUM,
        "value_ms": NUM,  # p99
        "limit_ms": NUM,
    },
)

# (several sources or consistency levels in one run: labelled with them)
UNREACHABLE = obj(
    {"region": STR, "replica": STR, "error": STR}, {"source": STR, "consistency": STR}
)

CLOCK = obj(
    {"endpoint": STR, "offset_ms": NUM, "uncertainty_ms": NUM},
    {"rtt_ms": NUM, "samples": INT},
)

WRITE_MS = obj({"count": INT, "errors": INT}, PERCENTILES["properties"])

AGENT = obj(
    {"region": STR, "agent": STR, "replicas": arr(STR)},
    {
        # The agent's clock against the prober's: both measured against the write
        # endpoint (see docs/agents.md); null until compared.
        "clock": nullable({"type": "object"}),
        "prober_clock": nullable(CLOCK),
        "agent_clock": nullable(CLOCK),
        "error": nullable(STR),
        "source": STR,
    },
)

FAILOVER = obj(
    {
        "source": STR,
        "kind": STR,
        "old_primary": nullable(STR),
        "new_primary": nullable(STR),
        "detected_ns": INT,
        "detected": STR,
    },
    {
        "master": nullable(STR),
        "new_primary_name": nullable(STR),
        "promoted_at_offset": nullable(INT),
        "old_last_offset": nullable(INT),
        "bytes_lost": nullable(INT),
        "lag_before_ms": nullable(NUM),
        "lag_after_ms": nullable(NUM),
        "notes": arr(STR),
    },
)

PROBE = obj(
    {
        "schema_version": {"const": SCHEMA_VERSION},
        "run_id": STR,
        "source": STR,
        "write_endpoint": STR,
        "mode": {"enum": ["auto", "push", "poll"]},
        "consistency": nullable(STR),
        "cluster_consistency": nullable(obj({"read": STR, "write": STR}, {"from": STR})),
        "started": {"type": "string", "format": "date-time"},
        "duration_s": NUM,
        "pairs": arr(PAIR),
        "write_ms": WRITE_MS,
        "clock": arr(CLOCK),
        "agents": arr(AGENT),
        "unreachable": arr(UNREACHABLE),
        "breaches": arr(BREACH),
        "notes": arr(STR),
        "replication": nullable(REPLICATION),
        "failovers": arr(FAILOVER),
    },
    {
        # --method dynomite-seed: per source, what each seed placement measured.
        "dynomite_seed": arr({"type": "object"}),
        "write_ms_by_consistency": mapping(WRITE_MS),
        # --with-alerts: what the run's alert rules decided and sent.
        "alerts": {"type": "object"},
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
    {
        "rpo_s_from": nullable(STR),
        "read_only": nullable(BOOL),
        # The latest check or repair run that compared the replica (from the store).
        "last_check": nullable(
            obj(
                {"run_id": STR, "kind": STR, "age_s": NUM, "divergent_keys": INT},
                {"group": STR},
            )
        ),
    },
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
