"""`--log-format json`: one JSON object per line on stderr, read here line by line.

The servers run as the platform runs them (a subprocess, its stderr a pipe); their
replicas are closed ports, so their units log failures at once without any Redis.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import tomli_w

from replag.lab.server import free_port
from replag.logfields import JsonLogFormatter, bind_log_fields, unit_fields
from tests.helpers.cli import replag_argv, replag_env, run_replag
from tests.helpers.configs import TOKEN

KEYS = {"time", "level", "logger", "message"}


def test_a_record_is_one_object_with_its_units_fields() -> None:
    formatter = JsonLogFormatter()
    record = logging.LogRecord(
        "replag.service", logging.WARNING, __file__, 1, "a\nb %s", ("c",), None
    )
    with bind_log_fields(**unit_fields("check:main")):
        line = formatter.format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "a\nb c" and entry["level"] == "warning"
    assert entry["logger"] == "replag.service" and entry["time"].endswith("+00:00")
    assert entry["unit"] == "check:main" and entry["group"] == "main"
    record.replica = "eu-west-1"  # what extra={"replica": ...} sets
    with bind_log_fields(**unit_fields("probe:us-east")):
        entry = json.loads(formatter.format(record))
    assert (entry["unit"], entry["region"], entry["replica"]) == (
        "probe:us-east",
        "us-east",
        "eu-west-1",
    )
    assert "group" not in json.loads(formatter.format(record))  # outside any unit


def closed_ports_config(tmp_path: Path) -> Path:
    def url() -> str:
        return f"redis://127.0.0.1:{free_port()}"

    data: dict[str, Any] = {
        "settings": {
            "store": str(tmp_path / "s.sqlite"),
            "api_token": TOKEN,
            "timeout": "300ms",
            "probe_interval": "300ms",
            "check_interval": "1s",
        },
        "regions": [
            {"name": "us-east", "write": url(), "replicas": [{"name": "us-east-1", "url": url()}],
             "agent": f"http://127.0.0.1:{free_port()}"},
            {"name": "eu-west", "replicas": [{"name": "eu-west-1", "url": url()}]},
        ],
        "groups": [{"name": "main", "members": ["us-east-1", "eu-west-1"]}],
    }  # fmt: skip
    path = tmp_path / "replag.toml"
    path.write_text(tomli_w.dumps(data))
    return path


class LogReader:
    """A server subprocess whose stderr lines are parsed as they come."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            replag_argv(*args),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=replag_env(env),
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, what: str, found: Any) -> dict[str, Any]:
        """The first parsed line for which `found(entry)` holds (every line must parse)."""
        while True:
            try:
                line = self.lines.get(timeout=60)
            except queue.Empty:
                raise AssertionError(f"no log line {what} within 60 s: {self.seen}") from None
            assert line is not None, f"exited before a line {what}: {self.seen}"
            self.seen.append(line)
            entry = json.loads(line)
            assert set(entry) >= KEYS, line
            if found(entry):
                return entry

    def stop(self) -> list[dict[str, Any]]:
        """SIGTERM; every line written until the exit, parsed."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        rest: list[dict[str, Any]] = []
        while (line := self.lines.get(timeout=10)) is not None:
            self.seen.append(line)
            rest.append(json.loads(line))
        assert self.proc.returncode == 0, self.seen
        return rest


def test_serve_logs_json_lines_naming_units_groups_and_regions(tmp_path: Path) -> None:
    config = closed_ports_config(tmp_path)
    port = free_port()
    reader = LogReader(
        ["--log-format", "json", "serve", "--config", str(config), "--port", str(port)], {}
    )
    try:
        running = reader.until("from uvicorn", lambda e: "Uvicorn running" in e["message"])
        assert running["logger"] == "uvicorn.error" and str(port) in running["message"]
        probe = reader.until("of a probe unit", lambda e: e.get("unit") == "probe:us-east")
        assert probe["region"] == "us-east"
        check = reader.until("of a check unit", lambda e: e.get("unit") == "check:main")
        assert check["group"] == "main"
    finally:
        rest = reader.stop()
    assert any("service stopped" in e["message"] for e in rest)


def test_agent_logs_json_lines_when_the_environment_says_so(tmp_path: Path) -> None:
    config = closed_ports_config(tmp_path)
    port = free_port()
    reader = LogReader(
        ["agent", "--config", str(config), "-r", "eu-west", "--listen", f"127.0.0.1:{port}"],
        {"REPLAG_LOG_FORMAT": "json", "REPLAG_AGENT_STATE_DIR": str(tmp_path / "agent")},
    )
    try:
        running = reader.until("from uvicorn", lambda e: "Uvicorn running" in e["message"])
        assert running["region"] == "eu-west"  # every line of a region's agent names it
        # A tree's lines name its replica (here: the replica's port is closed).
        tree = reader.until("of a replica's tree", lambda e: "replica" in e)
        assert tree["replica"] == "eu-west-1" and tree["logger"].startswith("replag.agent")
    finally:
        reader.stop()


def test_human_lines_stay_the_default(tmp_path: Path) -> None:
    config = closed_ports_config(tmp_path)
    out = run_replag("-v", "probe", "--config", str(config), timeout=60)
    assert out.returncode == 2 and not out.stderr.startswith("{"), out.stderr


def test_a_failing_command_s_last_word_is_a_json_line_too(tmp_path: Path) -> None:
    """A cron probe or a repair that cannot reach a replica: every stderr line parses, the
    error included (level error, naming the endpoint)."""
    config = str(closed_ports_config(tmp_path))
    for command in (["probe", "--config", config], ["repair", "check", "--config", config]):
        out = run_replag("--log-format", "json", "-v", *command, timeout=120)
        assert out.returncode == 2, out.stderr
        entries = [json.loads(line) for line in out.stderr.splitlines()]
        assert all(set(e) >= KEYS for e in entries)
        last = entries[-1]
        assert last["level"] == "error" and "unreachable" in last["message"], out.stderr


HUMAN = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S"
)


def test_a_servers_human_lines_have_one_format(tmp_path: Path) -> None:
    """uvicorn's lines (its start, its stop) come in replag's format, not `INFO:     …`."""
    config = closed_ports_config(tmp_path)
    proc = subprocess.Popen(
        replag_argv("serve", "--config", str(config), "--port", str(free_port())),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=replag_env({}),
    )
    assert proc.stderr is not None
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if "Uvicorn running" in line:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    lines += rest.splitlines()
    assert any("Uvicorn running" in x and " uvicorn.error: " in x for x in lines), lines
    assert [x for x in lines if x and not HUMAN.match(x)] == [], lines
