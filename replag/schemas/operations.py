"""Schemas of `replag topology dynomite-stats --json` and `replag lab up --json`."""

from __future__ import annotations

from replag.schemas.parts import BOOL, INT, NUM, SCHEMA_VERSION, STR, arr, nullable, obj, open_obj

DYNOMITE_STATS = obj(
    {
        "schema_version": {"const": SCHEMA_VERSION},
        # One per node that answered; its figures (peer_dropped_requests, …) beside these,
        # null where the node did not report one.
        "samples": arr(
            {
                **obj(
                    {
                        "node": STR,
                        "dc": STR,
                        "rack": STR,
                        "sampled_ns": INT,
                        "uptime_s": INT,
                        "backends": arr(STR),
                    }
                ),
                # The figures: integers, null where the node did not report one.
                "additionalProperties": nullable(INT),
            }
        ),
        # Stats URL → why it could not be read.
        "errors": {"type": "object", "additionalProperties": STR},
        "dropped_writes": arr(
            obj(
                {
                    "node": STR,
                    "dc": STR,
                    "rack": STR,
                    "dropped": INT,
                    "timed_out": INT,
                    "link_failures": INT,
                    "since_ns": INT,
                    "until_ns": INT,
                    "message": STR,
                    "peers_down": arr(STR),
                }
            )
        ),
    }
)

LAB_PROCESS = obj(
    {
        "name": STR,
        "pid": nullable(INT),
        "port": nullable(INT),
        "region": nullable(STR),
        "role": STR,
        "kind": STR,
    }
)

# The lab's state file as kept (lab.json): its processes and links are typed, the rest
# (agents, tokens, relay settings) is the lab's own and may grow.
LAB_UP = open_obj(
    {
        "schema_version": {"const": SCHEMA_VERSION},
        "engine": {"enum": ["replicated", "independent", "fleet"]},
        "processes": arr(LAB_PROCESS),
    },
    {
        "regions": arr(STR),
        # Each delayed link the relay runs (replication; with --wan the prober's views).
        "links": arr(open_obj({"kind": STR, "listen_port": INT, "name": STR})),
        "relay_control_port": nullable(INT),
        "prefix": STR,
        "delays_ms": {"type": "object", "additionalProperties": NUM},
        "back_ms": {"type": "object", "additionalProperties": NUM},
        "jitter_ms": NUM,
        "wan": BOOL,
        # --fleet: how many clusters it started (each a primary and two replicas).
        "clusters": INT,
    },
)
