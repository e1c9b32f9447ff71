"""Every endpoint in-process through httpx's ASGI transport, against a store we fill ourselves."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from replag.api.app import create_app
from replag.store import Store
from tests.helpers.configs import SECRETS, TOKEN, make_config
from tests.helpers.docs import docs_text
from tests.helpers.lag_windows import add_windows


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    store = Store(tmp_path / "s.sqlite")
    add_windows(store, pairs=[("us-east", "eu-west", 80.0), ("us-east", "us-east", 2.0)])
    application = create_app(make_config(tmp_path), store=store, run_schedulers=False)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://replag") as c:
        yield c


async def test_health_and_topology_without_secrets(client: httpx.AsyncClient) -> None:
    health = (await client.get("/api/v1/health")).json()
    assert health["status"] == "ok" and health["version"]
    topo = (await client.get("/api/v1/topology")).json()
    assert [r["name"] for r in topo["regions"]] == ["us-east", "eu-west"]
    assert topo["regions"][0]["write"]["url"] == "redis://:***@127.0.0.1:1"
    assert topo["settings"]["api_token"] == "***"


async def test_lag_merges_the_range(client: httpx.AsyncClient) -> None:
    body = (await client.get("/api/v1/lag", params={"source": "us-east", "target": "eu-west",
                                                    "since": "1h"})).json()  # fmt: skip
    [pair] = body["pairs"]
    assert pair["sent"] == 30 * 50 and pair["lost"] == 0
    assert 80 <= pair["lag_ms"]["p99"] <= 89
    assert 72 <= pair["lag_ms"]["p50"] <= 81
    short = (await client.get("/api/v1/lag", params={"since": "150s"})).json()
    assert {p["sent"] for p in short["pairs"]} == {3 * 50}  # windows ending in the last 150 s
    every = (await client.get("/api/v1/lag", params={"since": "1h"})).json()
    assert len(every["pairs"]) == 2


async def test_matrix_cells_and_thresholds(client: httpx.AsyncClient) -> None:
    body = (await client.get("/api/v1/lag/matrix", params={"since": "1h"})).json()
    cells = {(c["source"], c["target"]): c for c in body["cells"]}
    assert set(cells) == {("us-east", "eu-west"), ("us-east", "us-east")}
    assert cells[("us-east", "eu-west")]["p99_ms"] > cells[("us-east", "us-east")]["p99_ms"]
    assert body["thresholds_ms"] == {"warning": 100.0, "critical": 100.0}
    assert body["regions"] == ["us-east", "eu-west"]
    again = (await client.get("/api/v1/lag/matrix", params={"since": "1h"})).json()
    assert again["cells"] == body["cells"]  # served from the cache, same figures


async def test_series_buckets(client: httpx.AsyncClient) -> None:
    body = (
        await client.get(
            "/api/v1/lag/series",
            params={"source": "us-east", "target": "eu-west", "since": "1h", "step": "5m"},
        )
    ).json()
    assert body["step_s"] == 300
    assert 6 <= len(body["points"]) <= 7
    assert sum(p["sent"] for p in body["points"]) == 30 * 50
    assert all(p["t_ns"] % (300 * 10**9) == 0 for p in body["points"])
    default = (
        await client.get("/api/v1/lag/series", params={"source": "us-east", "target": "eu-west"})
    ).json()
    assert default["step_s"] >= 60 and default["points"]


async def test_every_value_the_schema_allows_gets_an_answer(client: httpx.AsyncClient) -> None:
    """Times are clamped to 1970–2200, a reversed range is empty, a step grows to fit."""
    reversed_range = await client.get("/api/v1/lag", params={"since": "10m", "until": "1h"})
    assert reversed_range.status_code == 200 and reversed_range.json()["pairs"] == []
    ancient = (await client.get("/api/v1/lag/matrix", params={"since": "9999999d"})).json()
    assert ancient["since_ns"] == 0 and ancient["cells"]
    iso = await client.get("/api/v1/lag/matrix", params={"since": "2020-01-01T00:00:00+02:00"})
    assert iso.json()["since_ns"] == 1_577_829_600 * 10**9
    params = {"source": "us-east", "target": "eu-west", "since": "30d", "step": "1s"}
    fine = (await client.get("/api/v1/lag/series", params=params)).json()
    assert fine["step_s"] == 519  # raised from 1 s to keep 30 days within 5000 points
    assert (await client.options("/api/v1/repairs")).headers["allow"] == "GET, POST"


@pytest.mark.parametrize(
    ("path", "params", "status", "fragment"),
    [
        ("/api/v1/lag", {"since": "yesterday"}, 422, "since"),
        ("/api/v1/lag", {"source": "mars"}, 404, "unknown region 'mars'"),
        ("/api/v1/lag/matrix", {"since": "-1"}, 422, "since"),
        ("/api/v1/lag/matrix", {"since": "1e16"}, 422, "not an ISO 8601 date-time"),
        ("/api/v1/lag/matrix", {"since": "2024-02-30T00:00:00Z"}, 422, "since"),
        ("/api/v1/lag/series", {"source": "us-east"}, 422, "target"),
        ("/api/v1/lag/series", {"source": "us-east", "target": "eu-west", "step": "1ms"}, 422,
         "step"),
        ("/api/v1/lag/series", {"source": "us-east", "target": "mars"}, 404, "unknown region"),
        ("/api/v1/repairs", {"limit": "0"}, 422, "limit"),
        ("/api/v1/repairs/nope", {}, 404, "no repair run"),
        ("/api/v1/alerts", {"history": "x"}, 422, "history"),
    ],
)  # fmt: skip
async def test_bad_parameters_get_a_4xx_with_a_message(
    client: httpx.AsyncClient, path: str, params: dict[str, str], status: int, fragment: str
) -> None:
    response = await client.get(path, params=params)
    assert response.status_code == status
    assert fragment in json.dumps(response.json())


async def test_post_repairs_needs_the_token(client: httpx.AsyncClient) -> None:
    missing = await client.post("/api/v1/repairs", json={"action": "check"})
    assert missing.status_code == 401 and "bearer" in missing.json()["detail"]
    wrong = await client.post("/api/v1/repairs", json={"action": "check"},
                              headers={"Authorization": "Bearer nope"})  # fmt: skip
    assert wrong.status_code == 401
    bad = await client.post("/api/v1/repairs", json={"action": "explode"},
                            headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert bad.status_code == 422
    # A flag that is not a JSON boolean is refused, not coerced ("N" is not false).
    for flags in ({"allow_deletes": "N"}, {"dry_run": "true"}, {"dry_run": 1}, {"ttls": "no"}):
        loose = await client.post("/api/v1/repairs", json={"action": "repair", **flags},
                                  headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        assert loose.status_code == 422, flags
        assert next(iter(flags)) in json.dumps(loose.json())
    unknown = await client.post("/api/v1/repairs", json={"action": "check", "group": "nope"},
                                headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert unknown.status_code == 404 and "unknown replica group" in unknown.json()["detail"]


async def test_post_repairs_starts_a_job(client: httpx.AsyncClient, app: FastAPI) -> None:
    response = await client.post("/api/v1/repairs",
                                 json={"action": "check", "group": "main", "ttls": "ignore"},
                                 headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert response.status_code == 202
    job = response.json()
    assert job["state"] == "running" and job["group"] == "main"
    finished = await app.state.service.wait_job(job["job_id"])
    # The members are closed ports: the check fails, and says which endpoint.
    assert finished.state == "failed" and "127.0.0.1" in (finished.error or "")
    listed = (await client.get("/api/v1/repairs")).json()
    assert listed["jobs"][0]["job_id"] == job["job_id"]
    one = (await client.get(f"/api/v1/repairs/{job['job_id']}")).json()
    assert one["job"]["state"] == "failed"


@pytest.mark.parametrize(
    ("policy", "status", "fragment"),
    [
        ("source:main-1", 202, ""),
        ("newest:ts", 202, ""),
        ("quorum", 202, ""),
        ("source:mars", 404, "no such replica or region"),
        ("newest", 422, "policy"),  # the library needs a FIELD
        ("source=us-east", 422, "policy"),
    ],
)
async def test_post_repairs_accepts_the_policies_repair_understands(
    client: httpx.AsyncClient, app: FastAPI, policy: str, status: int, fragment: str
) -> None:
    response = await client.post("/api/v1/repairs", headers={"Authorization": f"Bearer {TOKEN}"},
                                 json={"action": "repair", "group": "main", "policy": policy,
                                       "dry_run": True})  # fmt: skip
    assert response.status_code == status, response.text
    assert fragment in json.dumps(response.json())
    if status == 202:
        finished = await app.state.service.wait_job(response.json()["job_id"])
        # The members are closed ports: the run gets as far as connecting, not further.
        assert finished.state == "failed" and "policy" not in (finished.error or "")


async def test_a_job_of_every_group_and_a_job_of_one_group_exclude_each_other(
    app: FastAPI,
) -> None:
    from replag.errors import JobConflict

    svc = app.state.service
    one = svc.start_job("check", "main")
    with pytest.raises(JobConflict, match="main is already running"):
        svc.start_job("check", None)
    with pytest.raises(JobConflict, match="main is already running"):
        svc.start_job("check", "main")
    await svc.wait_job(one.id)
    every = svc.start_job("check", None)
    with pytest.raises(JobConflict, match="every group is already running"):
        svc.start_job("repair", "main")
    await svc.wait_job(every.id)
    again = svc.start_job("check", "main")  # both finished: nothing holds the group
    await svc.wait_job(again.id)


async def test_without_a_configured_token_every_change_is_refused(tmp_path: Path) -> None:
    application = create_app(make_config(tmp_path, token=None), run_schedulers=False)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://replag") as c:
            response = await c.post("/api/v1/repairs", json={},
                                    headers={"Authorization": "Bearer anything"})  # fmt: skip
    assert response.status_code == 403
    assert "no api_token configured" in response.json()["detail"]


async def test_alerts_endpoint_lists_active_history_and_sinks(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    await app.state.service.evaluate_alerts()  # p99 ~88 ms < 100 ms: nothing fires
    body = (await client.get("/api/v1/alerts")).json()
    assert body["active"] == [] and body["rules"][0]["name"] == "lag"
    assert [s["name"] for s in body["sinks"]] == ["hook", "pd"]
    assert body["sinks"][0]["last_status"] == "never" and body["sinks"][0]["signed"]


async def test_metrics_use_a_registry_per_app(tmp_path: Path, client: httpx.AsyncClient) -> None:
    text = (await client.get("/metrics")).text
    assert "replag_lag_seconds" in text and "replag_divergent_keys" in text
    other = create_app(make_config(tmp_path / "other"), run_schedulers=False)
    assert other.state.service.metrics.registry is not None
    assert other.state.service.metrics.registry is not (
        client._transport.app.state.service.metrics.registry  # type: ignore[attr-defined]
    )


async def test_no_response_contains_a_secret(client: httpx.AsyncClient) -> None:
    paths = ["/api/v1/health", "/api/v1/topology", "/api/v1/lag?since=1h",
             "/api/v1/lag/matrix", "/api/v1/alerts", "/api/v1/repairs", "/metrics", "/",
             "/openapi.json", "/api/v1/lag/series?source=us-east&target=eu-west",
             "/api/v1/dynomite"]  # fmt: skip
    for path in paths:
        response = await client.get(path)
        assert response.status_code == 200, path
        for secret in SECRETS:
            assert secret not in response.text, (path, secret)


async def test_dashboard_and_assets_are_served_locally(client: httpx.AsyncClient) -> None:
    page = (await client.get("/")).text
    assert (
        "/static/dashboard.js" in page and "http" not in page.split("<body>")[1].split("<footer")[0]
    )
    for asset in ("/static/dashboard.js", "/static/dashboard.css"):
        assert (await client.get(asset)).status_code == 200


async def test_api_docs_are_served_from_the_package(client: httpx.AsyncClient) -> None:
    for page in ("/docs", "/redoc"):
        html = (await client.get(page)).text
        assets = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert assets and all(a.startswith("/static/docs/") for a in assets), (page, assets)
        assert "https://" not in html and "http://" not in html, page
        for asset in assets:
            response = await client.get(asset)
            assert response.status_code == 200 and len(response.content) > 1000, asset


async def test_repair_runs_page_with_offset_and_total(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    for _ in range(3):
        job = app.state.service.start_job("check", "main")
        await app.state.service.wait_job(job.id)
    first = (await client.get("/api/v1/repairs", params={"limit": 2})).json()
    second = (await client.get("/api/v1/repairs", params={"limit": 2, "offset": 2})).json()
    assert first["total"] == second["total"] == 3
    assert len(first["runs"]) == 2 and len(second["runs"]) == 1
    ids = [r["run_id"] for r in first["runs"] + second["runs"]]
    assert len(set(ids)) == 3


def test_every_endpoint_and_metric_is_documented(app: FastAPI) -> None:
    docs = docs_text()
    for path in app.openapi()["paths"]:
        assert f"`GET {path}" in docs or f"`POST {path}" in docs, path
    for metric in app.state.service.metrics.registry.collect():
        assert metric.name in docs, metric.name
