"""What a discovery returns: a topology plus notes saying where each entry came from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replag.config import render_config
from replag.topology import Topology


@dataclass(frozen=True, kw_only=True)
class Discovery:
    """A discovered topology and the comments and settings its TOML file carries."""

    topology: Topology
    header: str
    comments: Mapping[str, str] = field(default_factory=dict)
    endpoint_comments: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    # Findings worth reporting that the topology cannot hold (e.g. Dynomite's consistency).
    facts: Mapping[str, Any] = field(default_factory=dict)

    def render(self, *, redact: bool = False) -> str:
        """The TOML file `load_config` reads back to `topology` (passwords as *** if `redact`)."""
        return render_config(
            self.topology,
            settings=self.settings or None,
            header=self.header,
            comments=self.comments,
            endpoint_comments=self.endpoint_comments,
            redact=redact,
        )
