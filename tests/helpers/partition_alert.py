"""A real `replag serve` over a two-region lab, scraped by a real Prometheus evaluating
given rules: eu-west is partitioned until `ReplagReplicaNotReplicating` fires, then
healed until it resolves. The scrape job and the rule files are the caller's (the
mixin's files, or what the Helm chart renders)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from replag.lab.cluster import lab_fault
from replag.prometheus_mixin import MixinParams
from tests.helpers.lab import LabFactory
from tests.helpers.prometheus_tools import binary, free_port, running
from tests.helpers.serve_process import lab_config, start_serve
from tests.helpers.waiting import until

SETTINGS = {"count": 10, "rate": 0, "timeout": "1s", "probe_interval": "300ms"}
# The mixin with windows short enough for a test: the rules are the same code.
FAST = MixinParams(rate_window="20s", not_replicating_window="5s", not_replicating_for="1s")
ALERT = "ReplagReplicaNotReplicating"


async def partition_fires_and_resolves(
    lab_factory: LabFactory,
    tmp_path: Path,
    *,
    port: int,
    rule_files: list[Path],
    scrape_job: dict[str, Any],
) -> dict[str, Any]:
    """Run the round trip; returns the alert as Prometheus fired it."""
    prometheus = binary("REPLAG_PROMETHEUS", "prometheus")
    lab = lab_factory(regions=("us-east", "eu-west"), delays_ms={"eu-west": 5})
    lab_dir = Path(lab["dir"])
    settings = {**SETTINGS, "store": str(tmp_path / "svc.sqlite")}
    config = lab_config(lab_dir, tmp_path / "replag.toml", groups=False, **settings)
    log = tmp_path / "serve.log"
    serve = await start_serve(config, port, log)
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    (prom_dir / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(p) for p in rule_files],
                "scrape_configs": [scrape_job],
            }
        )
    )
    prom_port = free_port()
    args = [
        prometheus,
        f"--config.file={prom_dir / 'prometheus.yml'}",
        f"--storage.tsdb.path={prom_dir / 'data'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
    ]
    base = f"http://127.0.0.1:{prom_port}"
    window = FAST.rate_window
    try:
        with running(args, ready_url=f"{base}/-/ready", log=prom_dir / "prometheus.log"):
            async with httpx.AsyncClient(base_url=base, timeout=10) as api:

                async def query(expr: str) -> list[dict[str, Any]]:
                    assert serve.returncode is None, log.read_text()[-3000:]
                    body = (await api.get("/api/v1/query", params={"query": expr})).json()
                    return list(body["data"]["result"])

                async def firing() -> list[dict[str, Any]]:
                    body = (await api.get("/api/v1/alerts")).json()
                    return [
                        a
                        for a in body["data"]["alerts"]
                        if a["labels"]["alertname"] == ALERT and a["state"] == "firing"
                    ]

                async def measured() -> bool:
                    expr = f'replica:replag_probes_lost:ratio_rate{window}{{replica="eu-west-1"}}'
                    return bool(await query(f"{expr} == 0"))

                async def fired() -> bool:
                    return bool(await firing())

                async def resolved() -> bool:
                    return not await firing()

                await until(measured, "Prometheus sees eu-west-1 replicating", timeout_s=90)
                assert await firing() == []
                lab_fault(lab_dir, "eu-west", "partition")
                await until(fired, "the partition alert firing", timeout_s=90)
                [alert] = await firing()
                lab_fault(lab_dir, "eu-west", "heal")
                await until(resolved, "the partition alert resolved after the heal", timeout_s=90)
                return alert
    finally:
        serve.terminate()
        await serve.wait()
