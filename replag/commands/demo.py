"""`replag demo`: lab up (three regions 40 ms and 80 ms away), probe, show, lab down."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import click

from replag.config import load_config
from replag.lab.cluster import LabSpec, lab_down, lab_up
from replag.probes import run_probe


@click.command(name="demo")
@click.option("--count", default=300, show_default=True, help="Probe keys to write.")
@click.option(
    "--mode", type=click.Choice(["auto", "push", "poll"]), default="auto", show_default=True
)
def command(count: int, mode: str) -> None:
    """Start a local three-region lab with injected delay, probe it and print the lag table."""
    spec = LabSpec(
        regions=("us-east", "us-west", "eu-west"),
        delays_ms={"us-west": 40.0, "eu-west": 80.0},
        jitter_ms=1.0,
    )
    with tempfile.TemporaryDirectory(prefix="replag-demo-") as tmp:
        lab_dir = Path(tmp) / "lab"
        click.echo(
            "starting lab: us-east (primary), us-west (+40 ms), eu-west (+80 ms), ±1 ms jitter …"
        )
        lab_up(lab_dir, spec)
        try:
            config = load_config(lab_dir / "topology.toml")
            report = asyncio.run(run_probe(config, count=count, mode=mode))
        finally:
            lab_down(lab_dir)
    click.echo(report.render())
    click.echo(
        "\nlab stopped. Next: `replag lab up --dir ./lab …` to keep one running, then "
        "`replag probe --config ./lab/topology.toml`."
    )
    sys.exit(report.exit_code)
