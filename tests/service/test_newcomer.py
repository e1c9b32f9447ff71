"""The newcomer's fleet, end to end on real servers: a primary with a password and two
replicas, one `replica-read-only no` holding 30 stray keys; discovered, checked from the
CLI, served; repaired from the CLI; one replica stopped (SIGSTOP) and resumed.

At each step failover advice, health, alerts, logs, gauges and the dashboard must say
what is so (issue 46). Waits are bounded polls: nothing asserts how fast.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from click.testing import CliRunner

from replag.cli import main
from replag.lab.server import RedisServer, free_port
from tests.helpers.browser import CHROMIUM, evaluate_when_loaded
from tests.helpers.redis_servers import RedisFactory, primary_with_a_writable_replica
from tests.helpers.waiting import wait_until
from tests.service.test_json_logs import LogReader

STRAY_KEYS = 30


def get(base: str, path: str) -> Any:
    with urllib.request.urlopen(base + path, timeout=10) as response:
        body = response.read().decode()
    return body if path == "/metrics" else json.loads(body)


def gauge(base: str, line_start: str) -> float | None:
    for line in get(base, "/metrics").splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def _answers(base: str) -> bool:
    try:
        get(base, "/api/v1/health")
    except OSError:
        return False
    return True


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, result.stdout


@pytest.fixture
def fleet(redis_factory: RedisFactory) -> Iterator[tuple[RedisServer, RedisServer, RedisServer]]:
    primary, clean, stray = primary_with_a_writable_replica(redis_factory)
    with stray.client() as client:
        client.mset({f"stray:{n}": "x" for n in range(STRAY_KEYS)})
    yield primary, clean, stray


def test_what_on_call_sees_is_what_is_so(
    fleet: tuple[RedisServer, RedisServer, RedisServer], tmp_path: Path
) -> None:
    primary, clean, stray = fleet
    name = f"127.0.0.1:{primary.port}"
    clean_name, stray_name = f"127.0.0.1:{clean.port}", f"127.0.0.1:{stray.port}"
    config = tmp_path / "replag.toml"
    code, _ = cli("topology", "discover", "--redis", primary.url, "--out", str(config))
    assert code == 0
    data = tomllib.loads(config.read_text())
    # Discovery named the set after its primary and wrote alert rules that speak at once.
    assert [r["name"] for r in data["regions"]] == [name]
    kinds = {r["kind"] for r in data["alerts"]["rules"]}
    assert {"divergent_keys", "unreachable", "lag_p99", "no_probe"} <= kinds
    assert "replication_link_down" in kinds
    data["settings"].update(
        probe_interval="1s", replication_interval="1s", check_interval="1h", timeout="500ms"
    )
    config.write_text(tomli_w.dumps(data))

    # 1. The CLI's check finds the stray keys; failover advice passes the replica over.
    code, out = cli("repair", "check", "--config", str(config), "--json")
    assert code == 1 and json.loads(out)["divergent"] == STRAY_KEYS
    code, out = cli("failover-check", "--config", str(config), "--format", "nagios")
    assert code == 0 and f"fail over to {clean_name}" in out
    assert f"passed over {stray_name} (writable" in out

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = LogReader(
        ["--log-format", "json", "serve", "--config", str(config), "--port", str(port)], {}
    )
    try:
        # 2. Serve: health, failover, gauges, alerts and the log say so.
        wait_until(lambda: _answers(base), "serve answers", timeout_s=60)

        def problems() -> dict[str, list[dict[str, Any]]]:
            out: dict[str, list[dict[str, Any]]] = {}
            for p in get(base, "/api/v1/health")["problems"]:
                out.setdefault(p["kind"], []).append(p)
            return out

        wait_until(lambda: "divergence" in problems(), "health names the divergence")
        health = get(base, "/api/v1/health")
        assert health["status"] != "ok"
        (divergence,) = problems()["divergence"]
        assert (
            divergence["replica"] == stray_name
            and f"{STRAY_KEYS} divergent" in (divergence["message"])
        )
        assert [p["replica"] for p in problems()["writable"]] == [stray_name]
        wait_until(lambda: get(base, "/api/v1/replication")["primaries"], "a replication sample")
        (p,) = get(base, "/api/v1/replication")["primaries"]
        assert p["failover"]["safest"] == clean_name
        stray_candidate = next(c for c in p["failover"]["candidates"] if c["replica"] == stray_name)
        assert stray_candidate["read_only"] is False and not stray_candidate["eligible"]
        assert stray_candidate["last_check"]["divergent_keys"] == STRAY_KEYS
        metric = f'replag_divergent_keys{{group="{name}"}}'
        wait_until(lambda: gauge(base, metric) == STRAY_KEYS, "the gauge reads the CLI's check")

        def firing() -> set[str]:
            alerts = get(base, "/api/v1/alerts")
            return {a["rule"] for a in alerts["active"] if a.get("status") == "firing"}

        wait_until(lambda: "divergence" in firing(), "the divergence alert fires")
        server.until("warning of the divergence", lambda e: e["level"] == "warning"
                     and "divergent" in e["message"] and stray_name in e["message"])  # fmt: skip

        # 3. A CLI repair: within a probe interval the gauge, health and alert follow.
        # (serve's own start-up check may hold the group a moment: then the CLI says so)
        def repaired() -> bool:
            result = CliRunner().invoke(main, ["repair", "run", "--config", str(config)])
            if result.exit_code == 2 and "already running" in result.output:
                return False
            assert result.exit_code == 0, result.output
            return True

        wait_until(repaired, "the CLI's repair ran", every_s=0.5)
        wait_until(lambda: gauge(base, metric) == 0, "the gauge follows the CLI's repair")
        wait_until(lambda: "divergence" not in problems(), "health drops the divergence")
        wait_until(lambda: "divergence" not in firing(), "the divergence alert resolves")
        server.until("saying the divergence is gone", lambda e: "problem gone" in e["message"]
                     and "divergent" in e["message"])  # fmt: skip
        (p,) = get(base, "/api/v1/replication")["primaries"]
        assert p["failover"]["safest"] == clean_name  # the stray replica is still writable

        # 4. The clean replica stopped: a problem, a WARNING, and no replica to advise.
        assert clean.pid is not None
        os.kill(clean.pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: any(
                    p.get("replica") == clean_name
                    for kind in ("replication", "unreachable", "not_replicating")
                    for p in problems().get(kind, [])
                ),
                "health names the stopped replica",
            )
            server.until("warning of the stopped replica", lambda e: e["level"] == "warning"
                         and clean_name in e["message"])  # fmt: skip
            (p,) = get(base, "/api/v1/replication")["primaries"]
            assert p["failover"]["safest"] != stray_name
            wait_until(
                lambda: clean_name in {u.get("replica") for u in problems().get("unreachable", [])},
                "the probe finds the stopped replica unreachable",
            )
            shots(base, tmp_path, stopped=clean_name, running=stray_name)
        finally:
            os.kill(clean.pid, signal.SIGCONT)
        wait_until(
            lambda: (
                not any(
                    p.get("replica") == clean_name
                    for kind in ("replication", "unreachable", "not_replicating")
                    for p in problems().get(kind, [])
                )
            ),
            "the resumed replica's problem clears",
        )
    finally:
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=30)


SCRIPT = """JSON.stringify({
  rows: [...document.querySelectorAll('.replica-row')]
    .map((r) => [r.dataset.replica, r.dataset.now]),
  titles: [...document.querySelectorAll('.chart-title')].map((t) => t.textContent),
  passed: [...document.querySelectorAll('.passed-over')].map((t) => t.textContent),
})"""


def shots(base: str, tmp_path: Path, *, stopped: str, running: str) -> None:
    """The dashboard at 1400 and 390 px: its tile, charts and failover say what is so
    while `stopped` is stopped; PNGs beside the test's files ($REPLAG_SHOTS keeps them)."""
    if CHROMIUM is None:
        return
    for width in (1400, 390):
        seen = json.loads(
            asyncio.run(evaluate_when_loaded(tmp_path, base + "/", SCRIPT, width=width))
        )
        rows = dict(seen["rows"])
        assert rows[stopped] == "bad" and rows[running] == "ok", rows
        # The running replica's chart never says the stopped one's outage.
        assert not any(running in t and "unreachable" in t for t in seen["titles"]), seen
        assert any("writable" in t for t in seen["passed"]), seen
        png = tmp_path / f"dashboard-{width}.png"
        subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / f'chromium-{width}'}", "--virtual-time-budget=8000",
             f"--window-size={width},2400", f"--screenshot={png}", base + "/"],
            capture_output=True, timeout=90, check=False,
        )  # fmt: skip
        keep = os.environ.get("REPLAG_SHOTS")
        if keep and png.exists():
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / png.name).write_bytes(png.read_bytes())
