"""`replag agent` building its tree from a replica that never lets a scan end (SCAN hands
out new cursors and keys for ever, DBSIZE claims 10^9 keys, so no bound derived from it
ends the scan soon): the agent stays within 100 MB of its size when the build began
(VmHWM from /proc), and SIGTERM ends it at once, the build cut short (it hung at
"Waiting for application shutdown" while the build went on)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from replag.lab.server import free_port
from tests.helpers.cli import replag_argv, replag_env
from tests.helpers.hostile import MemoryWatch
from tests.helpers.scripted import ScriptedServer, array, bulk

GROWTH_MB = 100
INFO = bulk(
    "# Server\r\nredis_version:7.2.0\r\nrun_id:" + "a" * 40 + "\r\n"
    "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:" + "0" * 40 + "\r\n"
    "master_repl_offset:0\r\n# Keyspace\r\ndb0:keys=1000000000,expires=0,avg_ttl=0\r\n"
)


def _endless(began: threading.Event, *, cycle: bool = False) -> dict[str, object]:
    """SCAN hands out a new cursor each call (with `cycle`: 7, 9, 7, 9, ...)."""

    def scan(command: list[bytes]) -> bytes:
        began.set()
        cursor = (9 if command[1] == b"7" else 7) if cycle else int(command[1]) + 1
        return array(bulk(b"%d" % cursor), array(*[bulk(f"k{cursor}-{i}") for i in range(100)]))

    return {
        "PING": b"+PONG\r\n",
        "INFO": INFO,
        "DBSIZE": b":1000000000\r\n",
        "CONFIG": array(bulk("notify-keyspace-events"), bulk("KEA")),
        "PSUBSCRIBE": lambda c: array(bulk("psubscribe"), bulk(c[1]), b":1\r\n"),
        "SUBSCRIBE": lambda c: array(bulk("subscribe"), bulk(c[1]), b":1\r\n"),
        "CLIENT": b":7\r\n",
        "SCAN": scan,
        "MGET": lambda c: array(*[bulk("v")] * (len(c) - 1)),
        "PTTL": b":-1\r\n",
    }


@pytest.mark.parametrize("scan", ["endless", "cycle"])
def test_an_agent_building_against_an_endless_scan_stays_bounded_and_stops_on_sigterm(
    tmp_path: Path, scan: str
) -> None:
    """Endless: the build goes on when SIGTERM comes. Cycle: each build ends at the cycle
    (the tree unavailable, the log naming the server and SCAN), tried again until SIGTERM."""
    began = threading.Event()
    port = free_port()
    answers = _endless(began, cycle=scan == "cycle")
    with ScriptedServer(answers) as server:  # type: ignore[arg-type]
        url = f"redis://{server.address}"
        config = tmp_path / "t.toml"
        config.write_text(
            f'[settings]\napi_token = "{"t" * 32}"\nagent_state_dir = "{tmp_path / "agent"}"\n'
            f'[[regions]]\nname = "b"\nagent = "http://127.0.0.1:{port}"\n'
            f'replicas = [{{name = "odd", url = "{url}"}}]\n'
            f'[[regions]]\nname = "a"\nreplicas = [{{name = "other", url = "{url}"}}]\n'
            '[[groups]]\nname = "g"\nmembers = ["other", "odd"]\n'
        )
        log = tmp_path / "agent.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                replag_argv("agent", "-c", str(config), "--region", "b"),
                stdout=out, stderr=out,
                env=replag_env({"REPLAG_CONNECT_TIMEOUT": "1s"}),
            )  # fmt: skip
        try:
            with MemoryWatch(proc.pid, began) as watch:
                health = f"http://127.0.0.1:{port}/agent/v1/health"
                deadline = time.monotonic() + 60  # a hang guard only
                building = False
                while not building and time.monotonic() < deadline:
                    assert proc.poll() is None, log.read_text()
                    try:
                        body = httpx.get(health, timeout=5).json()
                        if scan == "cycle":  # the tree unavailable, the agent's log says why
                            building = "SCAN ended: its cursor came back" in log.read_text()
                        else:
                            building = (
                                "building" in str(body) and server.names().count("SCAN") > 200
                            )
                    except httpx.TransportError:
                        pass
                    time.sleep(0.2)
                assert building, log.read_text()
                time.sleep(1.0)  # the build goes on
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(timeout=20)  # a hang guard: it hung for good before
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text, text
    grown = watch.growth_mb()
    assert grown and max(grown.values()) < GROWTH_MB, grown
