"""Configs tests build in memory: an API config full of secrets, one replica group."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from replag.config import Config, config_from_dict
from replag.lab.server import RedisServer

TOKEN = "t0ken-very-secret"
SECRETS = ("r3dis-pass", TOKEN, "hmac-k3y", "pd-r0uting")


def make_config(tmp_path: Path, *, token: str | None = TOKEN, **extra: Any) -> Config:
    """Two regions, a group, a rule and two sinks, with every kind of secret in `SECRETS`."""
    settings: dict[str, Any] = {"store": str(tmp_path / "s.sqlite")}
    if token:
        settings["api_token"] = token
    data = {
        "settings": settings,
        "regions": [
            {"name": "us-east", "write": "redis://:r3dis-pass@127.0.0.1:1",
             "replicas": ["redis://:r3dis-pass@127.0.0.1:2"]},
            {"name": "eu-west", "replicas": ["redis://:r3dis-pass@127.0.0.1:3"]},
        ],
        "groups": [{"name": "main", "members": ["redis://:r3dis-pass@127.0.0.1:2",
                                                "redis://:r3dis-pass@127.0.0.1:3"]}],
        "alerts": {
            "rules": [{"name": "lag", "kind": "lag_p99", "threshold": "100ms",
                       "severity": "critical"}],
            "sinks": [{"name": "hook", "kind": "webhook", "url": "http://127.0.0.1:9/x",
                       "secret": "hmac-k3y"},
                      {"name": "pd", "kind": "pagerduty", "routing_key": "pd-r0uting"}],
        },
        **extra,
    }  # fmt: skip
    return config_from_dict(data, where="replag.toml", environ={})


def group_config(
    tmp_path: Path, servers: Sequence[RedisServer], *, kind: str = "auto", **settings: Any
) -> Config:
    """A topology with one region and one replica per server, all in replica group "g"
    (of `kind`)."""
    data = {
        "settings": {"store": str(tmp_path / "replag.sqlite"), "repair_settle": "10ms", **settings},
        "regions": [
            {"name": f"r{i}", "replicas": [{"name": f"n{i}", "url": s.url}]}
            for i, s in enumerate(servers)
        ],
        "groups": [{"name": "g", "kind": kind, "members": [f"n{i}" for i in range(len(servers))]}],
    }
    return config_from_dict(data, where="test")
