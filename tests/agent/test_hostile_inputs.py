"""An agent against callers that hold a token but not good intentions (real trees of a
real server, the real app in-process): lag watches are their opener's, a token holds
a bounded number, every malformed body is a 4xx (hypothesis mutates valid bodies of
every POST route with extreme numbers, wrong types and junk), and nothing but health
answers without a token, the OpenAPI document included; no page loads from a CDN."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replag.agent.app import create_agent_app
from replag.agent.lag import LagPart
from replag.agent.region import RegionAgent
from replag.config import config_from_dict
from tests.helpers.agent import AGENT_TIMEOUT_S, LoopThread
from tests.helpers.keyspace import fill
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.waiting import until

SECRETS = {"alice": "alice-t0ken-long-enough", "bob": "bob-t0ken-long-enough-too",
           "fixer": "fixer-t0ken-long-enough"}  # fmt: skip


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRETS[name]}"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Running:
    """The agent and its app on a loop of their own; `call` makes one request."""

    def __init__(self, agent: RegionAgent) -> None:
        self.loop = LoopThread()
        self.agent = agent
        self.loop.run(agent.start())
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_agent_app(agent, run=False)),
            base_url="http://agent",
        )
        self.loop.run(
            until(
                lambda: agent.trees["r"].state == "current",
                "tree current",
                timeout_s=AGENT_TIMEOUT_S,
            ),
            timeout_s=AGENT_TIMEOUT_S + 10,
        )

    def call(self, method: str, path: str, who: str | None = None, **kw: Any) -> httpx.Response:
        headers = auth(who) if who else {}
        return self.loop.run(self.http.request(method, path, headers=headers, **kw))

    def close(self) -> None:
        self.loop.run(self.http.aclose())
        self.loop.run(self.agent.stop())
        self.loop.close()


@pytest.fixture
def running(redis_factory: RedisFactory, tmp_path: Path) -> Iterator[Running]:
    server = redis_factory("hostile", extra_args=("--notify-keyspace-events", "KA"))
    fill(server.client(), 200)
    tmp = tmp_path
    data = {
        "settings": {"store": str(tmp / "s.sqlite"), "agent_state_dir": str(tmp / "st"),
                     "agent_watches_per_token": 2, "notify_keyspace_events": "KA"},
        "regions": [
            {"name": "here", "agent": "http://127.0.0.1:1",
             "replicas": [{"name": "r", "url": server.url}]},
            {"name": "there", "replicas": [{"name": "o", "url": "redis://127.0.0.1:2"}]},
        ],
        "groups": [{"name": "g", "members": ["r", "o"]}],
        "api_tokens": [
            {"name": "alice", "scopes": ["read"], "token_env": "HOSTILE_ALICE"},
            {"name": "bob", "scopes": ["read"], "token_env": "HOSTILE_BOB"},
            {"name": "fixer", "scopes": ["repair"], "token_env": "HOSTILE_FIXER"},
        ],
    }  # fmt: skip
    environ = {"HOSTILE_ALICE": SECRETS["alice"], "HOSTILE_BOB": SECRETS["bob"],
               "HOSTILE_FIXER": SECRETS["fixer"]}  # fmt: skip
    config = config_from_dict(data, where="hostile.toml", environ=environ)
    run = Running(RegionAgent(config, "here", parts=[LagPart()], poll_s=0.1))
    yield run
    run.close()


def watch_body(run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "stem": b64(b"replag:probe:%s:" % run_id.encode()), "count": 1,
            "pattern": b64(b"replag:probe:%s:*" % run_id.encode()), "mode": "poll",
            "timeout_s": 30}  # fmt: skip


def test_a_watch_is_its_openers_and_a_token_holds_few(running: Running) -> None:
    opened = running.call("POST", "/agent/v1/lag/watches", "alice", json=watch_body("a1"))
    assert opened.status_code == 200, opened.text
    watch = opened.json()["watch"]
    path = f"/agent/v1/lag/watches/{watch}"
    # Another token sees no such watch, and cannot close it.
    for method in ("GET", "DELETE"):
        refused = running.call(method, path, "bob")
        assert refused.status_code == 404 and "no watch" in refused.json()["detail"]
    assert running.call("GET", path, "alice").json()["opened_by"]["token"] == "alice"
    # Two at most per token (agent_watches_per_token = 2); others may still open theirs.
    assert running.call("POST", "/agent/v1/lag/watches", "alice",
                        json=watch_body("a2")).status_code == 200  # fmt: skip
    third = running.call("POST", "/agent/v1/lag/watches", "alice", json=watch_body("a3"))
    assert third.status_code == 429 and "agent_watches_per_token" in third.json()["detail"]
    bobs = running.call("POST", "/agent/v1/lag/watches", "bob", json=watch_body("b1"))
    assert bobs.status_code == 200
    assert running.call("DELETE", path, "alice").status_code == 200
    assert running.call("POST", "/agent/v1/lag/watches", "alice",
                        json=watch_body("a4")).status_code == 200  # fmt: skip


def test_only_health_is_open_and_nothing_loads_from_a_cdn(running: Running) -> None:
    assert running.call("GET", "/agent/v1/health").status_code == 200
    for path in ("/openapi.json", "/metrics", "/agent/v1/replicas", "/agent/v1/lag/clock"):
        assert running.call("GET", path).status_code == 401, path
    document = running.call("GET", "/openapi.json", "alice")
    assert document.status_code == 200 and "/agent/v1/replicas/{name}/nodes" in document.text
    # Swagger UI behind the token too, from files installed with replag: no CDN.
    page = running.call("GET", "/docs", "alice")
    assert page.status_code == 200 and "cdn" not in page.text.lower()
    assert "/static/docs/swagger-ui-bundle.js" in page.text
    for path in ("/docs", "/static/docs/swagger-ui-bundle.js"):
        assert running.call("GET", path).status_code == 401, path
    asset = running.call("GET", "/static/docs/swagger-ui-bundle.js", "alice")
    assert asset.status_code == 200 and asset.headers["content-type"].startswith(
        "application/javascript"
    )
    assert running.call("GET", "/static/docs/..%2Fapp.py", "alice").status_code == 404
    assert running.call("GET", "/redoc", "alice").status_code == 404


# Values that are in range only where harmless (0, a millisecond), else extreme.
_SCALARS = st.sampled_from(
    [None, True, 0, -1, 2**31, 2**63, 2**64, 2**70, -(2**70), 0.001, -0.5, 1e308, "", "!!",
     "aw==", "0" * 40, "zz", "\x00", "string"]
)  # fmt: skip
_JUNK = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6,
)  # fmt: skip
_TEMPLATES: dict[str, dict[str, Any]] = {
    "/agent/v1/replicas/r/nodes": {"level": 0, "nodes": [0], "down": 1, "auto": False,
                                   "fresh": False, "wait_s": 0},
    "/agent/v1/replicas/r/leaves": {"leaves": [0]},
    "/agent/v1/replicas/r/keys/observe": {"keys": ["aw=="], "settle_s": 0, "once": True,
                                          "keep": False, "fields": []},
    "/agent/v1/replicas/r/keys/read-for-copy": {"key": "aw==", "expected": None,
                                                "tolerance_ms": 0},
    "/agent/v1/replicas/r/keys/write": {"key": b64(b"hostile:k"), "expected": None,
                                        "tolerance_ms": 0, "age_ms": 0,
                                        "write": {"op": "delete", "payload": None, "pttl": -1}},
    "/agent/v1/lag/watches": watch_body("fz"),
}  # fmt: skip


def _mutated(value: Any) -> st.SearchStrategy[Any]:
    if isinstance(value, dict):
        fields = {k: _mutated(v) for k, v in value.items()}
        return st.one_of(
            st.fixed_dictionaries(fields, optional={"extra": _JUNK}),
            _JUNK,
        )
    if isinstance(value, list):
        return st.one_of(st.just(value), st.lists(_JUNK, max_size=3), _JUNK)
    return st.one_of(st.just(value), _JUNK)


_REQUESTS = st.sampled_from(sorted(_TEMPLATES)).flatmap(
    lambda path: st.tuples(st.just(path), _mutated(_TEMPLATES[path]))
)


def test_every_malformed_body_is_a_client_error(running: Running) -> None:
    seen: set[int] = set()

    @settings(
        max_examples=250,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(_REQUESTS)  # fmt: skip
    def check(request: tuple[str, Any]) -> None:
        path, body = request
        answer = running.call("POST", path, "fixer", json=body)
        seen.add(answer.status_code)
        assert answer.status_code < 500, (path, body, answer.text)
        if path.endswith("/watches") and answer.status_code == 200:
            running.call("DELETE", f"/agent/v1/lag/watches/{answer.json()['watch']}", "fixer")

    check()
    assert {200, 422} <= seen
    # The same extremes where they are known to have overflowed or tripped an assert.
    for path, body in [
        ("/agent/v1/replicas/r/nodes", {"level": 0, "nodes": [2**70], "down": 1}),
        ("/agent/v1/replicas/r/leaves", {"leaves": [2**70]}),
        ("/agent/v1/replicas/r/keys/write",
         {"key": "aw==", "expected": None, "tolerance_ms": 0, "age_ms": 0,
          "write": {"op": "restore", "payload": None, "pttl": -1}}),
        ("/agent/v1/replicas/r/keys/write",
         {"key": "aw==", "expected": ["string", "f" * 40, 2**70], "tolerance_ms": 0,
          "age_ms": 0, "write": {"op": "delete"}}),
    ]:  # fmt: skip
        answer = running.call("POST", path, "fixer", json=body)
        assert 400 <= answer.status_code < 500, (path, answer.text)


def test_nan_and_infinity_in_an_agent_body_are_400(running: Running) -> None:
    for constant in ("NaN", "Infinity", "-Infinity"):
        body = f'{{"leaves": [{constant}]}}'.encode()
        answer = running.call("POST", "/agent/v1/replicas/r/leaves", "fixer", content=body)
        assert answer.status_code == 400 and "is not JSON" in answer.text, answer.text
