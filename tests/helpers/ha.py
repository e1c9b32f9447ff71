"""Several `replag serve` processes on one store, for the HA tests: an instance and its
API, who owns which unit, probe runs in the store, a webhook receiver counting
notifications."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from replag.lab.server import free_port
from replag.store import Store
from tests.helpers.cli import spawn_replag
from tests.helpers.configs import TOKEN
from tests.helpers.waiting import wait_until


class Instance:
    """One `replag serve` subprocess and its API."""

    def __init__(self, config: Path, log_dir: Path, name: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        self.proc = spawn_replag(
            "serve", "--config", str(config), "--port", str(self.port), log=self.log_path
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def get(self, path: str) -> Any:
        return httpx.get(self.base + path, timeout=10).json()

    def health(self) -> dict[str, Any] | None:
        try:
            return dict(self.get("/api/v1/health"))
        except (httpx.TransportError, ValueError):
            return None

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            with_signal(self.proc, signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def with_signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)


def owner_of(instances: list[Instance], unit: str) -> Instance | None:
    """The instance holding `unit`'s lease, as any live instance's health says."""
    for inst in instances:
        if inst.proc.poll() is not None:
            continue
        health = inst.health()
        if health is None:
            continue
        for entry in health["instances"]:
            if unit in entry["owns"]:
                pid = int(entry["instance"].split(":")[1])
                return next((i for i in instances if i.pid == pid), None)
        return None
    return None


def probe_starts(url: str, source: str) -> list[int]:
    with Store(url) as store:
        rows = store.execute(
            "SELECT started_ns FROM probe_runs WHERE source = ? ORDER BY started_ns", (source,)
        )
    return [int(r.started_ns) for r in rows]


def work_shared(instances: list[Instance]) -> bool:
    """Every live instance owns at most its fair share of the units (all owned units over
    the instances, rounded up): none gives a lease up to share the work any more."""
    live = [i for i in instances if i.proc.poll() is None]
    health = live[0].health() if live else None
    if health is None:
        return False
    entries = health["instances"]
    fair = max(1, math.ceil(sum(len(e["owns"]) for e in entries) / max(1, len(entries))))
    return len(entries) == len(live) and all(len(e["owns"]) <= fair for e in entries)


def probe_runs_counted(inst: Instance, source: str) -> float:
    text = httpx.get(inst.base + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("replag_probe_runs_total{") and f'source="{source}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


class Receiver(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.received_ns: list[int] = []  # when each body arrived (this host's clock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                receiver.received_ns.append(time.time_ns())
                receiver.bodies.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def notifications(self, alertname: str) -> list[tuple[str, str, str, int, str]]:
        """(status, startsAt, notificationId, when received, sender) of every notification
        of `alertname`, as received; the sender is the instance's API address (its
        externalURL: `Instance.base`)."""
        return [
            (a["status"], a["startsAt"], a["notificationId"], at, body["externalURL"])
            for body, at in zip(self.bodies, self.received_ns, strict=True)
            for a in body.get("alerts", [])
            if a["labels"].get("alertname") == alertname
        ]

    def statuses(self, alertname: str) -> list[str]:
        return [
            a["status"]
            for body in self.bodies
            for a in body.get("alerts", [])
            if a["labels"].get("alertname") == alertname
        ]


def start(fleet: list[Instance], config: Path, tmp_path: Path, n: int) -> None:
    """Start `n` more instances; return once every live one sees them all."""
    for _ in range(n):
        fleet.append(Instance(config, tmp_path, f"serve-{len(fleet)}"))
    live = [i for i in fleet if i.proc.poll() is None]
    wait_until(
        lambda: all((h := i.health()) is not None and len(h["instances"]) == len(live)
                    for i in live),
        f"{len(live)} instances see each other",
        timeout_s=90,
        every_s=0.3,
    )  # fmt: skip


def kill(inst: Instance) -> int:
    inst.proc.send_signal(signal.SIGKILL)
    inst.proc.wait()
    return time.time_ns()


# Gauges exported by the owner of a unit only: (metric name prefix, the unit it is of).
UNIT_GAUGES = {
    "replag_unreachable_replicas{": lambda labels: f"probe:{labels['source']}",
    "replag_replication_link_up{": lambda labels: "replication",
}


def _labels(series: str) -> dict[str, str]:
    inner = series[series.index("{") + 1 : series.rindex("}")]
    return dict(part.split("=", 1) for part in inner.replace('"', "").split(",") if part)


def gauges_follow_leases(instances: list[Instance]) -> bool:
    """Every unit's gauges are exported by its owner and by no other instance, and at most
    one instance (the evaluator) says alerts are firing: /metrics scraped on every
    instance and summed counts each thing once."""
    live = [i for i in instances if i.proc.poll() is None]
    health = live[0].health()
    if health is None:
        return False
    owners = {
        unit: int(entry["instance"].split(":")[1])
        for entry in health["instances"]
        for unit in entry["owns"]
    }
    exported: set[str] = set()
    firing_on = 0
    for inst in live:
        text = httpx.get(inst.base + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("replag_alerts_firing "):
                firing_on += float(line.rsplit(" ", 1)[1]) > 0
            for prefix, unit_of in UNIT_GAUGES.items():
                if line.startswith(prefix):
                    unit = unit_of(_labels(line.rsplit(" ", 1)[0]))
                    if owners.get(unit) != inst.pid:
                        return False  # exported by an instance that does not own it
                    exported.add(unit)
    expected = {u for u in owners if u.startswith("probe:") or u == "replication"}
    return expected <= exported and firing_on <= 1


def repair_accepted(base: str, *, timeout_s: float) -> httpx.Response:
    """POST a repair of group g (policy source:n0) to `base` until it is not 409 (the
    scheduled check of g, a slot, runs somewhere meanwhile); that last answer."""
    answers: list[httpx.Response] = []

    def post() -> bool:
        answers.append(httpx.post(
            base + "/api/v1/repairs",
            json={"action": "repair", "group": "g", "policy": "source:n0"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        ))  # fmt: skip
        return answers[-1].status_code != 409

    wait_until(post, "the repair accepted", timeout_s=timeout_s, every_s=0.5)
    return answers[-1]
