"""Schemathesis against the generated OpenAPI: whatever the input, never a server error."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings

from replag.api.app import create_app
from replag.store import Store
from tests.helpers.configs import TOKEN, make_config
from tests.helpers.lag_windows import add_windows


@pytest.fixture
def api(tmp_path: Path) -> FastAPI:
    store = Store(tmp_path / "s.sqlite")
    add_windows(store, pairs=[("us-east", "eu-west", 40.0)], minutes=10)
    return create_app(make_config(tmp_path), store=store, run_schedulers=False)


async def test_no_input_makes_a_server_error(api: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", api)
    failures: list[str] = []
    async with api.router.lifespan_context(api):
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://replag") as client:
            for operation in schema.get_all_operations():
                op = operation.ok()

                @settings(max_examples=40, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))  # fmt: skip
                @given(case=op.as_strategy())
                def collect(case: schemathesis.Case, out: list[schemathesis.Case]) -> None:
                    out.append(case)

                cases: list[schemathesis.Case] = []
                collect(out=cases)
                for case in cases:
                    kwargs = case.as_transport_kwargs(base_url="http://replag")
                    headers = dict(kwargs.get("headers") or {})
                    if op.method.upper() == "POST" and len(cases) % 2:
                        headers["Authorization"] = f"Bearer {TOKEN}"
                    response = await client.request(
                        kwargs["method"], kwargs["url"], params=kwargs.get("params"),
                        headers=headers, json=kwargs.get("json"),
                    )  # fmt: skip
                    if response.status_code >= 500 and response.status_code != 503:
                        failures.append(
                            f"{op.method} {kwargs['url']} {kwargs.get('params')} "
                            f"{kwargs.get('json')!r} -> {response.status_code}"
                        )
                    elif response.status_code < 500:
                        assert response.status_code in (200, 202, 400, 401, 403, 404, 409, 422)
    assert failures == []
