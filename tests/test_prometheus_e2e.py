"""End to end: a real Prometheus (v0.316.0, REPLAG_PROMETHEUS, built once per machine by
.ci/go-tools.sh; skipped without it) scrapes a real `replag serve` over a lab, evaluates
the mixin's rules (generated with short windows), and fires the partition alert
(`ReplagReplicaNotReplicating`) when a region is partitioned, then resolves it after
the heal."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any

import httpx
import tomli_w

from replag.lab.cluster import lab_fault
from replag.prometheus_mixin import MixinParams, generate
from tests.helpers.cli import replag_argv, replag_env
from tests.helpers.lab import LabFactory
from tests.helpers.prometheus_tools import binary, free_port, running
from tests.helpers.waiting import until

SETTINGS = {"count": 10, "rate": 0, "timeout": "1s", "probe_interval": "300ms"}
# The mixin with windows short enough for a test: the rules are the same code.
FAST = MixinParams(rate_window="20s", not_replicating_window="5s", not_replicating_for="1s")


def prometheus_config(directory: Path, replag_port: int) -> Path:
    rule_files = []
    for name, text in generate(FAST).items():
        (directory / name).write_text(text)
        rule_files.append(str(directory / name))
    path = directory / "prometheus.yml"
    path.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: [{', '.join(rule_files)}]\n"
        "scrape_configs:\n  - job_name: replag\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{replag_port}']\n"
    )
    return path


async def test_prometheus_fires_and_resolves_the_partition_alert(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    prometheus = binary("REPLAG_PROMETHEUS", "prometheus")
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={"eu-west": 5})
    lab_dir = Path(lab["dir"])
    data = tomllib.loads((lab_dir / "topology.toml").read_text())
    data.pop("groups", None)
    data["settings"].update(SETTINGS, store=str(tmp_path / "svc.sqlite"))
    config = tmp_path / "replag.toml"
    config.write_text(tomli_w.dumps(data))

    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        serve = await asyncio.create_subprocess_exec(
            *replag_argv("serve", "--config", str(config), "--port", str(port)),
            stderr=out, env=replag_env(),
        )  # fmt: skip
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    prom_port = free_port()
    args = [
        prometheus,
        f"--config.file={prometheus_config(prom_dir, port)}",
        f"--storage.tsdb.path={prom_dir / 'data'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
    ]
    base = f"http://127.0.0.1:{prom_port}"
    try:
        with running(args, ready_url=f"{base}/-/ready", log=prom_dir / "prometheus.log"):
            async with httpx.AsyncClient(base_url=base, timeout=10) as api:

                async def query(expr: str) -> list[dict[str, Any]]:
                    assert serve.returncode is None, log.read_text()[-3000:]
                    body = (await api.get("/api/v1/query", params={"query": expr})).json()
                    return list(body["data"]["result"])

                async def alert(name: str) -> list[dict[str, Any]]:
                    body = (await api.get("/api/v1/alerts")).json()
                    return [
                        a
                        for a in body["data"]["alerts"]
                        if a["labels"]["alertname"] == name and a["state"] == "firing"
                    ]

                async def measured() -> bool:
                    ratio = await query(
                        'replica:replag_probes_lost:ratio_rate20s{replica="eu-west-1"} == 0'
                    )
                    return bool(ratio)

                await until(measured, "Prometheus sees eu-west-1 replicating", timeout_s=90)
                assert await alert("ReplagReplicaNotReplicating") == []

                lab_fault(lab_dir, "eu-west", "partition")
                await until(
                    lambda: _has(alert("ReplagReplicaNotReplicating")),
                    "the partition alert firing",
                    timeout_s=90,
                )
                [fired] = await alert("ReplagReplicaNotReplicating")
                assert fired["labels"]["replica"] == "eu-west-1"
                assert fired["labels"]["severity"] == "critical"
                assert fired["annotations"]["runbook_url"].endswith(
                    "/runbooks/prometheus-alerts/#replagreplicanotreplicating"
                )

                lab_fault(lab_dir, "eu-west", "heal")
                await until(
                    lambda: _none(alert("ReplagReplicaNotReplicating")),
                    "the partition alert resolved after the heal",
                    timeout_s=90,
                )
    finally:
        serve.terminate()
        await serve.wait()


async def _has(found: Any) -> bool:
    return bool(await found)


async def _none(found: Any) -> bool:
    return not await found
