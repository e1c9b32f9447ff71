"""Secrets stay out of everything replag shows or keeps.

Passwords planted in a URL, a password file and an environment variable (the file-wide
`password_env`), an API token from the environment and a named one from a file: none
appears in any command's output or log (debug level), in the store, in any API answer
or in /metrics; nor, through a region agent, in the agent's log, its audit file or its
answers. `topology discover --password-env` writes a reference, never the
password.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import tomllib
from pathlib import Path

import httpx
import pytest
import tomli_w

from replag.api.app import create_app
from replag.config import load_config
from replag.lab.server import RedisServer, free_port
from tests.helpers.agent import start_agent, stop_agent
from tests.helpers.cli import run_replag
from tests.helpers.redis_servers import FAST_SYNC, RedisFactory, wait_listed

URL_PW = "url-pl4nted-Secret"
FILE_PW = "file-pl4nted-Secret"
ENV_PW = "env-pl4nted-Secret"
TOKEN = "tok3n-pl4nted-Secret-legacy"
NAMED = "tok3n-pl4nted-Secret-named"
WRONG = "wr0ng-pl4nted-Secret"
SECRETS = (URL_PW, FILE_PW, ENV_PW, TOKEN, NAMED, WRONG)
ENV = {"PLANTED_ENV_PW": ENV_PW, "REPLAG_API_TOKEN": TOKEN, "DISCOVER_PW": URL_PW}


def replag(*args: str) -> str:
    """stdout and stderr of `replag -vv ARGS` (debug logging on)."""
    done = run_replag("-vv", *args, timeout=600, env=ENV)
    return f"$ replag {' '.join(args)} → {done.returncode}\n{done.stdout}\n{done.stderr}"


def planted(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def servers(redis_factory: RedisFactory) -> tuple[RedisServer, RedisServer, RedisServer]:
    s1 = redis_factory("s1", password=URL_PW)
    s2 = redis_factory(
        "s2",
        password=FILE_PW,
        extra_args=("--replicaof", "127.0.0.1", str(s1.port), "--masterauth", URL_PW, *FAST_SYNC),
    )
    s3 = redis_factory("s3", password=ENV_PW)
    wait_listed(s1, [s2])
    with s1.client() as c:
        c.set("only-on-s1", "1")
    return s1, s2, s3


def write_config(tmp_path: Path, s1: RedisServer, s2: RedisServer, s3: RedisServer) -> Path:
    (tmp_path / "s2.pw").write_text(FILE_PW + "\n")
    (tmp_path / "ops.token").write_text(NAMED)
    data = {
        "settings": {"store": str(tmp_path / "store.sqlite"), "password_env": "PLANTED_ENV_PW",
                     "repair_settle": "10ms", "store_shared": True},
        "regions": [{
            "name": "a",
            "write": {"name": "s1", "url": f"redis://:{URL_PW}@127.0.0.1:{s1.port}"},
            "replicas": [{"name": "s2", "url": f"redis://127.0.0.1:{s2.port}",
                          "password_file": str(tmp_path / "s2.pw")}],
        }],
        "groups": [{"name": "g", "members": ["s1", {"name": "s3",
                                                    "url": f"redis://127.0.0.1:{s3.port}"}]}],
        "api_tokens": [{"name": "ops", "scopes": ["repair"],
                        "token_file": str(tmp_path / "ops.token")}],
    }  # fmt: skip
    path = tmp_path / "replag.toml"
    path.write_text(tomli_w.dumps(data))
    return path


async def test_planted_secrets_appear_nowhere(
    redis_factory: RedisFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s1, s2, s3 = servers(redis_factory)
    path = write_config(tmp_path, s1, s2, s3)
    shown = [
        replag("probe", "-c", str(path), "--count", "5"),
        replag("probe", "-c", str(path), "--count", "5", "--json"),
        replag("repair", "check", "-c", str(path), "--json"),
        replag("repair", "check", "-c", str(path)),
        replag("acl", "--mode", "repair", "--user", "ops", "-c", str(path), "--check"),
        replag("topology", "discover", "--redis", f"redis://127.0.0.1:{s1.port}",
               "--password-env", "DISCOVER_PW"),
    ]  # fmt: skip
    # A wrong password is named as wrong, never echoed.
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(path.read_text().replace(f":{URL_PW}@", f":{WRONG}@"))
    shown.append(replag("probe", "-c", str(wrong), "--count", "5"))
    shown.append(replag("probe", "-c", str(wrong), "--count", "5", "--json"))
    assert "authentication failed" in shown[-2] and "***" in shown[-2]
    codes = [s.split(" → ", 1)[1].split("\n", 1)[0] for s in shown]
    assert codes == ["0", "0", "1", "1", "0", "0", "2", "2"], "\n".join(shown)
    assert "wrote" not in shown[5] and "password_env" in shown[5]

    caplog.set_level(logging.DEBUG)
    config = load_config(path, environ={**os.environ, **ENV})
    app = create_app(config, run_schedulers=False)
    answers: list[str] = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replag") as client:
            started = await client.post("/api/v1/repairs", json={"action": "repair", "group": "g",
                                        "policy": "source:s1"},
                                        headers={"Authorization": f"Bearer {NAMED}"})  # fmt: skip
            assert started.status_code == 202, started.text
            job = await app.state.service.wait_job(started.json()["job_id"])
            assert job.state == "done", job.error
            paths = (await client.get("/openapi.json")).json()["paths"]
            for route, operations in paths.items():
                if "get" in operations and "{" not in route:
                    answers.append((await client.get(route)).text)
            answers.append((await client.get(f"/api/v1/repairs/{job.run_id}")).text)
            answers.append((await client.get("/metrics")).text)
    assert any('"started_by"' in a and '"ops"' in a for a in answers)

    store = sqlite3.connect(tmp_path / "store.sqlite")
    dump = "\n".join(store.iterdump())
    store.close()
    assert "only-on-s1" in dump  # the runs are there
    leaks = {
        "output": planted("\n".join(shown)),
        "api": planted("\n".join(answers)),
        "log": planted(caplog.text),
        "store": planted(dump),
    }
    assert leaks == {"output": [], "api": [], "log": [], "store": []}, shown


def test_discover_writes_a_reference_to_the_password(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    s1, _, _ = servers(redis_factory)
    out = tmp_path / "found.toml"
    printed = replag("topology", "discover", "--redis", f"redis://127.0.0.1:{s1.port}",
                     "--password-env", "DISCOVER_PW", "--out", str(out))  # fmt: skip
    assert "wrote" in printed and not planted(printed)
    text = out.read_text()
    assert not planted(text) and 'password_env = "DISCOVER_PW"' in text
    config = load_config(out, environ={"DISCOVER_PW": URL_PW})
    assert {ep.password for ep in config.topology.endpoints()} == {URL_PW}
    both = replag("topology", "discover", "--redis", f"redis://:{URL_PW}@127.0.0.1:{s1.port}",
                  "--password-env", "DISCOVER_PW")  # fmt: skip
    assert "→ 2" in both and "give the password once" in both


def test_planted_secrets_stay_out_of_the_agent_path(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    """A region agent (its own process, debug logging) reaches its servers with a password
    from a file and one from the file-wide variable, takes the legacy token and a named
    one from a file (which the coordinator presents), and is sent a wrong token: none of
    them is in its log, its audit file, its answers, or the coordinator's output."""
    s1, s2, s3 = servers(redis_factory)
    path = write_config(tmp_path, s1, s2, s3)
    port = free_port()
    data = tomllib.loads(path.read_text())
    data["settings"] |= {"agent_token": "ops", "agent_state_dir": str(tmp_path / "agent"),
                         "agent_wait": "300s", "allow_config_changes": True}  # fmt: skip
    [region] = data["regions"]
    near = {"name": "a", "write": region["write"]}
    s3_table = {"name": "s3", "url": f"redis://127.0.0.1:{s3.port}"}
    far = {"name": "b", "agent": f"http://127.0.0.1:{port}",
           "replicas": [*region["replicas"], s3_table]}  # fmt: skip
    data["regions"] = [near, far]
    data["groups"] = [{"name": "g", "members": ["s1", "s3"]}]
    path.write_text(tomli_w.dumps(data))
    log = tmp_path / "agent.log"
    env = {**ENV}
    agent = start_agent(path, "b", port, log, env=env, log_level="debug")
    answers: list[str] = []
    try:
        shown = [
            replag("repair", "check", "-c", str(path), "--json"),
            replag("repair", "run", "-c", str(path), "--policy", "source:s1"),
            replag("probe", "-c", str(path), "--count", "3", "--timeout", "1s", "--json"),
        ]
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=60) as http:
            good = {"Authorization": f"Bearer {NAMED}"}
            for route in ("/agent/v1/health", "/agent/v1/replicas", "/metrics"):
                answers.append(http.get(base + route, headers=good).text)
            wrong = http.get(
                base + "/agent/v1/replicas", headers={"Authorization": f"Bearer {WRONG}"}
            )
            assert wrong.status_code == 401
    finally:
        stop_agent(agent)
    codes = [s.split(" → ", 1)[1].split("\n", 1)[0] for s in shown]
    assert codes[:2] == ["1", "0"], "\n".join(shown)
    logged = log.read_text()
    assert (
        "replag.audit" in logged and "by token 'ops'" in logged and "wrong bearer token" in logged
    )
    kept = (tmp_path / "agent" / "b" / "audit.jsonl").read_text()
    assert '"token": "ops"' in kept
    leaks = {
        "output": planted("\n".join(shown)),
        "agent log": planted(logged),
        "audit file": planted(kept),
        "agent api": planted("\n".join(answers)),
    }
    assert leaks == {"output": [], "agent log": [], "audit file": [], "agent api": []}


async def test_a_webhook_url_with_credentials_stays_out_of_delivery_errors(tmp_path: Path) -> None:
    """A webhook that redirects forever: aiohttp's error quotes the URL (its password,
    its ?token=); the error logged, stored and shown by the API is redacted."""
    from aiohttp import web

    from replag.alerts.config import AlertSink
    from replag.alerts.delivery import AlertSender
    from replag.store import Store
    from tests.alerts.test_sinks import event

    async def loop(request: web.Request) -> web.Response:
        raise web.HTTPFound(str(request.url))

    app = web.Application()
    app.router.add_post("/{tail:.*}", loop)
    app.router.add_get("/{tail:.*}", loop)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    url = f"http://ops:{URL_PW}@127.0.0.1:{port}/hook?token={NAMED}"
    hook = AlertSink(name="ops", kind="webhook", url=url, retries=0)
    sender = AlertSender([hook], Store(tmp_path / "s.sqlite"))
    try:
        [result] = await sender.deliver([event()])
        statuses = sender.statuses()
    finally:
        await sender.close()
        await runner.cleanup()
    assert not result.ok and result.error
    assert planted(f"{result.error} {statuses}") == []
