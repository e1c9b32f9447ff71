"""The processes a lab started: one typed entry each, as `lab.json` lists them.

Each is recorded (in the list that becomes `lab.json`'s `processes`, and in
`DIR/NAME.pid`) as soon as it runs, so a failure part-way through `lab up` stops
exactly what was started, and `lab down` finds everything later.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

# What the process's command line must show before `lab down` signals its pid.
ProcessKind = Literal["redis-server", "relay", "sentinel", "agent", "postgres"]


@dataclass(frozen=True, kw_only=True)
class LabProcess:
    name: str
    pid: int
    port: int | None
    region: str | None
    role: str  # primary, replica, independent, relay, view-relay, sentinel, agent
    kind: ProcessKind

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def record(lab_dir: Path, started: list[dict[str, Any]], process: LabProcess) -> None:
    """List `process` in `started` (lab.json's list) and write its pid file."""
    started.append(process.to_dict())
    (lab_dir / f"{process.name}.pid").write_text(f"{process.pid}\n")
