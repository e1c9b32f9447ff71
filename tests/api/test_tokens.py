"""Named API tokens with scopes: who may start what, and the run remembers who did."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from replag.api.app import create_app
from replag.config import config_from_dict
from replag.errors import ConfigError
from replag.repair import get_run
from tests.helpers.redis_servers import RedisFactory

CHECKER = "checker-secret-0123456789"
REPAIRER = "repairer-secret-0123456789"
READER = "reader-secret-0123456789"


def token_config(tmp_path: Path, ports: tuple[int, int], **settings: Any) -> dict[str, Any]:
    secret_file = tmp_path / "repairer.token"
    secret_file.write_text(REPAIRER + "\n")
    return {
        "settings": {"store": str(tmp_path / "s.sqlite"), "repair_settle": "10ms", **settings},
        "groups": [{"name": "g", "members": [f"redis://127.0.0.1:{p}" for p in ports]}],
        "api_tokens": [
            {"name": "ops-check", "scopes": ["check"], "token_env": "CHECK_TOKEN"},
            {"name": "ops-repair", "scopes": ["repair"], "token_file": str(secret_file)},
            {"name": "grafana", "scopes": ["read"], "token_env": "READ_TOKEN"},
        ],
    }


ENV = {"CHECK_TOKEN": CHECKER, "READ_TOKEN": READER}


@pytest.fixture
async def two(redis_factory: RedisFactory) -> tuple[int, int]:
    a, b = redis_factory("a"), redis_factory("b")
    with a.client() as c:
        c.set("k", "1")
    return a.port, b.port


async def served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("10.9.8.7", 4242))
        async with httpx.AsyncClient(transport=transport, base_url="http://replag") as c:
            yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_scopes_decide_and_the_run_records_the_token(
    tmp_path: Path, two: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    config = config_from_dict(token_config(tmp_path, two), where="t", environ=ENV)
    app = create_app(config, run_schedulers=False)
    caplog.set_level(logging.INFO, logger="replag.audit")
    async for client in served(app):
        refused = await client.post(
            "/api/v1/repairs", json={"action": "repair", "group": "g"}, headers=bearer(CHECKER)
        )
        assert refused.status_code == 403, refused.text
        assert "'ops-check' lacks the repair scope" in refused.json()["detail"]
        reader = await client.post(
            "/api/v1/repairs", json={"action": "check", "group": "g"}, headers=bearer(READER)
        )
        assert reader.status_code == 403 and "lacks the check scope" in reader.text
        check = await client.post(
            "/api/v1/repairs", json={"action": "check", "group": "g"}, headers=bearer(CHECKER)
        )
        assert check.status_code == 202, check.text
        await app.state.service.wait_job(check.json()["job_id"])
        started = await client.post(
            "/api/v1/repairs", json={"action": "repair", "group": "g"}, headers=bearer(REPAIRER)
        )
        assert started.status_code == 202, started.text
        job = started.json()
        assert job["started_by"] == {
            "token": "ops-repair",
            "client": "10.9.8.7:4242",
            "job_id": job["job_id"],
        }
        finished = await app.state.service.wait_job(job["job_id"])
        assert finished.state == "done", finished.error
        run = get_run(app.state.service.store, finished.run_id)
        assert run is not None
        assert run["params"]["started_by"]["token"] == "ops-repair"
        shown = (await client.get(f"/api/v1/repairs/{finished.run_id}")).json()
        assert shown["params"]["started_by"]["client"] == "10.9.8.7:4242"
    lines = [r.getMessage() for r in caplog.records if r.name == "replag.audit"]
    started_line = next(line for line in lines if job["job_id"] in line)
    assert "repair of g started by token 'ops-repair' from 10.9.8.7:4242" in started_line
    assert any("'ops-check'" in line and "lacks the repair scope" in line for line in lines)
    text = "\n".join(lines) + caplog.text
    assert not any(secret in text for secret in (CHECKER, REPAIRER, READER))


async def test_reads_need_a_token_when_settings_say_so(
    tmp_path: Path, two: tuple[int, int]
) -> None:
    config = config_from_dict(token_config(tmp_path, two, api_reads="token"), where="t",
                              environ=ENV)  # fmt: skip
    app = create_app(config, run_schedulers=False)
    async for client in served(app):
        assert (await client.get("/api/v1/health")).status_code == 401
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/api/v1/health", headers=bearer("nope"))).status_code == 401
        assert (await client.get("/api/v1/health", headers=bearer(READER))).status_code == 200
        assert (await client.get("/metrics", headers=bearer(CHECKER))).status_code == 200
        # The API's own description is a read too (and its pages load nothing from a CDN).
        for page in ("/openapi.json", "/docs", "/redoc"):
            assert (await client.get(page)).status_code == 401, page
            shown = await client.get(page, headers=bearer(READER))
            assert shown.status_code == 200 and "cdn." not in shown.text, page
        # A platform's probes need no token and learn nothing about the fleet.
        assert (await client.get("/-/healthy")).json() == {"status": "ok"}
        assert (await client.get("/-/ready")).json() == {"status": "ready"}
    assert not app.state.ready  # stopped: a load balancer sends nothing more


@pytest.mark.parametrize(
    ("tokens", "environ", "fragment"),
    [
        ([{"name": "x", "scopes": ["read"], "token_env": "T"}], {"T": "sh0rt!"},
         "api_tokens[0].token_env: token 'x' is shorter than 16 characters"),
        ([{"name": "x", "scopes": [], "token_env": "T"}], {"T": CHECKER},
         "api_tokens[0].scopes: name at least one scope"),
        ([{"name": "x", "scopes": ["write"], "token_env": "T"}], {"T": CHECKER},
         "expected one of read, check, repair"),
        ([{"name": "x", "scopes": ["read"]}], {}, "token_env or its token_file"),
        ([{"name": "x", "scopes": ["read"], "token_env": "T"}], {},
         "environment variable T is not set"),
        ([{"name": "x", "scopes": ["read"], "token_file": "/nonexistent/t"}], {},
         "cannot read secret file /nonexistent/t"),
        ([{"name": "x", "scopes": ["read"], "token_env": "T"},
          {"name": "x", "scopes": ["read"], "token_env": "U"}], {"T": CHECKER, "U": REPAIRER},
         "duplicate token name 'x'"),
        ([{"name": "x", "scopes": ["read"], "token_env": "T"},
          {"name": "y", "scopes": ["read"], "token_env": "T"}], {"T": CHECKER},
         "token 'y' has the same secret as 'x'"),
    ],
)  # fmt: skip
def test_bad_token_declarations_are_one_line_errors(
    tokens: list[dict[str, Any]], environ: dict[str, str], fragment: str
) -> None:
    data = {"groups": [{"name": "g", "members": ["redis://h:1", "redis://h:2"]}],
            "api_tokens": tokens}  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data, where="replag.toml", environ=environ)
    assert fragment in str(caught.value)
    assert not any(s in str(caught.value) for s in (CHECKER, REPAIRER, "sh0rt!"))
