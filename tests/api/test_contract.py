"""The API's contract: every 200 typed in /openapi.json, errors as documented, offline docs."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from replag.api.app import create_app
from replag.store import Store
from tests.helpers.configs import TOKEN, make_config


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    application = create_app(
        make_config(tmp_path), store=Store(tmp_path / "s.sqlite"), run_schedulers=False
    )
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://replag") as c:
        yield c


def test_every_success_answer_has_a_typed_schema(app: FastAPI) -> None:
    document = app.openapi()
    schemas = document["components"]["schemas"]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            ok = [c for c in operation["responses"] if c.startswith("2")]
            assert ok, (method, path)
            for code in ok:
                schema = operation["responses"][code]["content"]["application/json"]["schema"]
                name = schema["$ref"].rsplit("/", 1)[-1]  # a named model, not a bare object
                assert schemas[name]["properties"], name


async def test_a_body_that_is_not_json_is_400_and_without_the_token_401(
    client: httpx.AsyncClient,
) -> None:
    body = b'{"action": "check",'
    headers = {"Content-Type": "application/json"}
    bearer = {**headers, "Authorization": f"Bearer {TOKEN}"}
    refused = await client.post("/api/v1/repairs", content=body, headers=bearer)
    assert refused.status_code == 400 and "not JSON" in refused.json()["detail"]
    anonymous = await client.post("/api/v1/repairs", content=body, headers=headers)
    assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"] == "Bearer"
    wrong = {**headers, "Authorization": "Bearer nope"}
    assert (await client.post("/api/v1/repairs", content=body, headers=wrong)).status_code == 401
    # Valid JSON of the wrong shape is still a 422 naming the field, once authenticated.
    shape = await client.post("/api/v1/repairs", json={"action": 7}, headers=bearer)
    assert shape.status_code == 422 and "action" in shape.text


async def test_redoc_and_swagger_load_nothing_from_the_network(client: httpx.AsyncClient) -> None:
    for page in ("/redoc", "/docs"):
        html = (await client.get(page)).text
        urls = re.findall(r"""(?:src|href)=["']([^"']+)""", html)
        assert urls and all(u.startswith("/") for u in urls), (page, urls)
        for script in re.findall(r"""src=["']([^"']+\.js)""", html):
            text = (await client.get(script)).text
            assert (await client.get(script)).status_code == 200
            assert "cdn.redoc.ly" not in text and "cdn.jsdelivr" not in text


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
async def test_nan_and_infinity_in_a_body_are_400_not_500(
    client: httpx.AsyncClient, constant: str
) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    for body in (f'{{"action": {constant}}}', f'{{"action": "check", "rate": {constant}}}'):
        refused = await client.post("/api/v1/repairs", content=body.encode(), headers=headers)
        assert refused.status_code == 400, refused.text
        assert f"{constant} is not JSON" in refused.json()["detail"]
