"""`/metrics` against the API on the same samples: quantiles agree within a bucket's width at
the default resolution and within 5 % at 48 buckets a decade, every series exists early, and
a replica costs the series budget docs/metrics.md states."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from statistics import NormalDist

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from replag.api.app import create_app
from replag.config import Config
from replag.histogram import LagHistogram
from replag.metrics import LAG_BUCKETS_PER_DECADE
from replag.probes.report import ProbeSample
from replag.store import LagWindow, Store
from tests.helpers.configs import make_config

# (median lag in ms, log-normal spread): narrow spreads are the hard case for buckets,
# since every sample falls into one or two of them.
CASES = [
    (0.12, 0.05),
    (0.4, 0.3),
    (1.3, 0.01),
    (5.0, 0.2),
    (20.0, 0.02),
    (57.0, 0.05),
    (80.0, 0.0125),
    (250.0, 0.3),
    (900.0, 0.1),
    (3000.0, 0.02),
    (8000.0, 0.08),
]
SAMPLES = 400


def known_samples_ms(median_ms: float, sigma: float) -> list[float]:
    """Log-normal quantiles at evenly spaced ranks: the same figures on every run."""
    normal = NormalDist()
    return [
        median_ms * math.exp(sigma * normal.inv_cdf((i + 0.5) / SAMPLES)) for i in range(SAMPLES)
    ]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile over cumulative (le, count) buckets, as Prometheus does it."""
    buckets = sorted(buckets)
    assert math.isinf(buckets[-1][0])
    rank = q * buckets[-1][1]
    b = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


def configured(tmp_path: Path, per_decade: int = LAG_BUCKETS_PER_DECADE) -> Config:
    config = make_config(tmp_path)
    settings = dataclasses.replace(config.settings, lag_buckets_per_decade=per_decade)
    return dataclasses.replace(config, settings=settings)


@pytest.fixture(params=[LAG_BUCKETS_PER_DECADE, 48], ids=lambda n: f"{n}-a-decade")
async def app(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[FastAPI]:
    store = Store(tmp_path / "s.sqlite")
    application = create_app(configured(tmp_path, request.param), store=store, run_schedulers=False)
    application.state.per_decade = request.param
    now = time.time_ns()
    windows, samples = [], []
    for i, (median_ms, sigma) in enumerate(CASES):
        window = LagWindow(
            run_id="known",
            source="us-east",
            target=f"t{i}",
            replica=f"t{i}-1",
            start_ns=now - 10**9,
            end_ns=now,
            sent=SAMPLES,
            seen=SAMPLES,
        )
        for seq, lag_ms in enumerate(known_samples_ms(median_ms, sigma)):
            window.lag.record_us(lag_ms * 1000)
            window.uncertainty.record_us(10)
            samples.append(
                ProbeSample(
                    target=f"t{i}",
                    replica=f"t{i}-1",
                    seq=seq,
                    lag_ns=round(lag_ms * 1e6),
                    uncertainty_ns=10_000,
                )
            )
        windows.append(window)
    store.append_windows(windows)
    application.state.service.metrics.observe_probe(
        source="us-east",
        samples=samples,
        write=LagHistogram(),
        unreachable=0,
        finished_s=time.time(),
    )
    async with application.router.lifespan_context(application):
        yield application


async def test_histogram_quantile_reads_within_a_bucket_of_the_api(app: FastAPI) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://replag") as client:
        exact = {
            p["target"]: p["lag_ms"]
            for p in (await client.get("/api/v1/lag", params={"since": "1h"})).json()["pairs"]
        }
        text = (await client.get("/metrics")).text
    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "replag_lag_seconds":
            for s in family.samples:
                if s.name == "replag_lag_seconds_bucket":
                    le = float(s.labels["le"])
                    buckets.setdefault(s.labels["target"], []).append((le, s.value))
    errors = []
    for i, (median_ms, _) in enumerate(CASES):
        for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
            from_metrics = histogram_quantile(q, buckets[f"t{i}"]) * 1000
            error = from_metrics / exact[f"t{i}"][key] - 1
            errors.append(
                (
                    abs(error),
                    f"{median_ms} ms {key}: {from_metrics:.4g} vs "
                    f"{exact[f't{i}'][key]:.4g} ms ({error:+.1%})",
                )
            )
    worst = max(errors)
    # A bucket is 10^(1/n) wide: 58.5 % at the default 5, 4.9 % at 48.
    per_decade = app.state.per_decade
    width = 10 ** (1 / per_decade) - 1
    assert worst[0] <= (0.05 if per_decade == 48 else width), worst[1]


def test_every_series_of_a_replica_exists_from_its_first_probe(app: FastAPI) -> None:
    metrics = app.state.service.metrics
    metrics.observe_probe(
        source="us-west",
        replicas=[("eu-west", "eu-west-1", None)],
        samples=[],
        write=LagHistogram(),
        unreachable=0,
        finished_s=time.time(),
    )
    text = metrics.render().decode()
    labels = 'rack="",replica="eu-west-1",source="us-west",target="eu-west"'
    assert f"replag_probes_lost_total{{{labels}}} 0.0" in text
    assert f"replag_probes_sent_total{{{labels}}} 0.0" in text
    assert f"replag_lag_seconds_count{{{labels}}} 0.0" in text
    assert 'replag_probe_runs_total{outcome="error",source="us-west"} 0.0' in text


def test_a_replica_costs_the_series_budget(app: FastAPI) -> None:
    """Counted in /metrics as Prometheus would store them: every sample line of one
    replica (buckets with +Inf, _count, _sum, _created)."""
    per_decade = app.state.per_decade
    text = app.state.service.metrics.render().decode()
    lag = sent_lost = 0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("replica") != "t0-1":
                continue
            if s.name.startswith("replag_lag_seconds"):
                lag += 1
            elif s.name.startswith(("replag_probes_sent", "replag_probes_lost")):
                sent_lost += 1
    assert lag == 5 * per_decade + 2 + 3
    if per_decade == LAG_BUCKETS_PER_DECADE:
        assert lag <= 30, "docs/metrics.md#series-budget promises 30"
        assert lag + sent_lost == 34
