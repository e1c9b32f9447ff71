"""A real OpenTelemetry Collector (the OTLP receiver, file exporters) for the OTLP export
test, from the binary `.ci/go-tools.sh` builds once per machine (REPLAG_OTELCOL); tests
skip without it. What it receives is written as OTLP JSON lines the test reads."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.prometheus_tools import binary, free_port, stop


@dataclass
class Collector:
    endpoint: str  # the OTLP/HTTP base URL replag is given
    directory: Path

    def received(self, signal: str) -> list[dict[str, Any]]:
        """Every export request of `signal` (metrics, traces) received so far."""
        path = self.directory / f"{signal}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def config(directory: Path, port: int) -> dict[str, Any]:
    return {
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{port}"}}}},
        "exporters": {
            f"file/{signal}": {
                "path": str(directory / f"{signal}.jsonl"),
                "flush_interval": "100ms",
            }
            for signal in ("metrics", "traces")
        },
        "service": {
            # No internal telemetry server: it would take port 8888 on a shared machine.
            "telemetry": {"metrics": {"level": "none"}},
            "pipelines": {
                signal: {"receivers": ["otlp"], "exporters": [f"file/{signal}"]}
                for signal in ("metrics", "traces")
            },
        },
    }


@contextlib.contextmanager
def collector(directory: Path) -> Iterator[Collector]:
    """The Collector on a free port until the block ends."""
    otelcol = binary("REPLAG_OTELCOL", "otelcol-replag")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (directory / "config.yaml").write_text(yaml.safe_dump(config(directory, port)))
    log = directory / "otelcol.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [otelcol, f"--config={directory / 'config.yaml'}"], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while True:  # no health endpoint in this build: ready when the receiver listens
            assert proc.poll() is None, (
                f"otelcol exited {proc.returncode}: {log.read_text()[-2000:]}"
            )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert time.monotonic() < deadline, f"otelcol not listening: {log.read_text()[-2000:]}"
            time.sleep(0.1)
        yield Collector(f"http://127.0.0.1:{port}", directory)
    finally:
        stop(proc)
