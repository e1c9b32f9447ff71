"""Schemathesis over the whole OpenAPI document, with and without the token.

Every operation gets schema-valid and schema-violating requests; each answer goes
through every check schemathesis has for a response (status declared, content
type, body against the schema, valid input accepted, invalid input refused, auth
enforced, no server error). Any failure of any check fails the test, with the
request that caused it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from replag.api.app import create_app
from replag.store import Store
from tests.helpers.configs import TOKEN, make_config
from tests.helpers.lag_windows import add_windows

EXAMPLES = 15  # per operation and mode, with the token
# Without it every request is refused before its input is read: fewer show that as well.
EXAMPLES_WITHOUT_TOKEN = 5


@pytest.fixture
def api(tmp_path: Path) -> FastAPI:
    store = Store(tmp_path / "s.sqlite")
    add_windows(store, pairs=[("us-east", "eu-west", 40.0)], minutes=10)
    return create_app(make_config(tmp_path), store=store, run_schedulers=False)


def cases(
    operation: schemathesis.APIOperation, mode: GenerationMode, examples: int
) -> list[schemathesis.Case]:
    found: list[schemathesis.Case] = []

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=operation.as_strategy(generation_mode=mode))
    def collect(case: schemathesis.Case) -> None:
        found.append(case)

    try:
        collect()
    except Unsatisfiable:  # nothing can violate a schema without parameters (GET /health)
        assert mode is GenerationMode.NEGATIVE
    return found


@pytest.mark.parametrize("token", [True, False], ids=["with-token", "without-token"])
def test_every_operation_conforms_to_its_schema(api: FastAPI, token: bool) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", api)
    headers = {"Authorization": f"Bearer {TOKEN}"} if token else {}
    failures: list[str] = []
    tested, declared = set(), set()
    for result in schema.get_all_operations():
        operation = result.ok()
        declared.add(operation.label)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for case in cases(operation, mode, EXAMPLES if token else EXAMPLES_WITHOUT_TOKEN):
                tested.add(operation.label)
                try:
                    case.call_and_validate(headers=headers)
                except AssertionError as exc:  # schemathesis' failures are AssertionErrors
                    failures.append(f"{operation.label} ({mode.value}): {exc}")
    assert tested == declared and len(declared) >= 10  # every operation the API declares
    assert failures == [], "\n\n".join(failures[:5])
