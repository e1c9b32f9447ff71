"""Region agents over mutual TLS, with named scoped tokens and an audit of their writes.

Real `replag agent` processes serve HTTPS with a certificate of a CA made here and
require client certificates of that CA (`agent_tls_client_ca`); the coordinator
verifies them and presents its own (per agent table, or `agent_tls_client_*`). A check,
a repair and a probe work through them; a wrong CA, an expired agent certificate, a
wrong name, a missing client certificate and one the agent does not trust each stop a
command with one line naming the agent, exit 2. The agent takes the service's
`[[api_tokens]]` with scopes (read, check, repair): a read token cannot make it write
(403), and every write is logged by `replag.audit` with the token's name, the client
and the coordinator's run, and kept in the agent's audit file.
"""

from __future__ import annotations

import json
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomli_w

from replag.lab.server import RedisServer, free_port
from replag.repair.trees.remote import keys_to_wire
from tests.helpers.agent import start_agent, stop_agent
from tests.helpers.cli import run_replag
from tests.helpers.redis_servers import FAST_SYNC, wait_listed
from tests.helpers.tls import Pki, make_pki

COORDINATOR = "coordinator-t0ken-0001"
GRAFANA = "grafana-t0ken-00000001"
CHECKER = "checker-t0ken-00000001"
ENV = {"AGENT_SEC_COORDINATOR": COORDINATOR, "AGENT_SEC_CHECKER": CHECKER}


@dataclass
class AgentLab:
    dir: Path
    pki: Pki
    near: RedisServer  # scanned directly
    far: RedisServer  # its replica, writable; compared through the agent
    port: int  # the agent, mutual TLS
    expired_port: int  # an agent serving an expired certificate

    def client_context(self, *, cert: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        if cert:
            context.load_cert_chain(str(self.pki.client_cert), str(self.pki.client_key))
        return context

    def config(self, name: str, *, agent: dict[str, Any] | None = None, **settings: Any) -> Path:
        """A file with the agent of `far` (its table: `agent`), the coordinator's client
        certificate file-wide, and the tokens."""
        pki = self.pki
        base = {
            "store": str(self.dir / "store.sqlite"),
            # The lab's variants of one config (a bad certificate...) share it.
            "store_shared": True,
            "agent_state_dir": str(self.dir / "state"),
            "agent_wait": "300s",
            "repair_settle": "10ms",
            "agent_tls_cert": str(pki.server_cert),
            "agent_tls_key": str(pki.server_key),
            "agent_tls_client_ca": str(pki.ca),
            "agent_tls_ca": str(pki.ca),
            "agent_tls_client_cert": str(pki.client_cert),
            "agent_tls_client_key": str(pki.client_key),
            "agent_token": "coordinator",
            **settings,
        }
        (self.dir / "grafana.token").write_text(GRAFANA + "\n")
        data = {
            "settings": {k: v for k, v in base.items() if v is not None},
            "regions": [
                {"name": "near", "write": {"name": "n", "url": self.near.url}},
                {"name": "far", "agent": agent or f"https://127.0.0.1:{self.port}",
                 "replicas": [{"name": "f", "url": self.far.url}]},
            ],
            # f replicates n (a probe's keys reach it) and is writable, so a key can be
            # made to differ; as peers, a repair writes to f itself, through its agent.
            "groups": [{"name": "g", "kind": "peers", "members": ["n", "f"]}],
            "api_tokens": [
                {"name": "coordinator", "scopes": ["repair"], "token_env": "AGENT_SEC_COORDINATOR"},
                {"name": "grafana", "scopes": ["read"],
                 "token_file": str(self.dir / "grafana.token")},
                {"name": "checker", "scopes": ["check"], "token_env": "AGENT_SEC_CHECKER"},
            ],
        }  # fmt: skip
        path = self.dir / name
        path.write_text(tomli_w.dumps(data))
        return path


def replag(*args: str) -> subprocess.CompletedProcess[str]:
    return run_replag(*args, timeout=600, env=ENV)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentLab]:
    root = tmp_path_factory.mktemp("agent-security")
    pki = make_pki(root / "pki")
    servers: list[RedisServer] = []
    agents: list[subprocess.Popen[bytes]] = []
    try:
        for name in ("near", "far"):
            args: tuple[str, ...] = ("--notify-keyspace-events", "KA")
            if servers:
                args += ("--replicaof", "127.0.0.1", str(servers[0].port),
                         "--replica-read-only", "no", *FAST_SYNC)  # fmt: skip
            server = RedisServer(name=name, port=free_port(), workdir=root / "redis",
                                 extra_args=args)  # fmt: skip
            servers.append(server.start())
        wait_listed(servers[0], servers[1:])
        lab = AgentLab(root, pki, servers[0], servers[1], free_port(), free_port())
        agents.append(
            start_agent(
                lab.config("agent.toml"),
                "far",
                lab.port,
                root / "agent.log",
                tls=lab.client_context(),
                env=ENV,
            )
        )
        expired = lab.config(
            "expired-agent.toml",
            agent=f"https://127.0.0.1:{lab.expired_port}",
            agent_tls_cert=str(pki.expired_cert),
            agent_tls_key=str(pki.expired_key),
            agent_state_dir=str(root / "expired-state"),
        )
        no_verify = ssl.create_default_context()
        no_verify.check_hostname, no_verify.verify_mode = False, ssl.CERT_NONE
        no_verify.load_cert_chain(str(pki.client_cert), str(pki.client_key))
        agents.append(
            start_agent(
                expired, "far", lab.expired_port, root / "expired-agent.log", tls=no_verify, env=ENV
            )
        )
        yield lab
    finally:
        for agent in agents:
            stop_agent(agent)
        for server in servers:
            server.stop()


def test_check_repair_and_probe_through_an_mtls_agent_are_audited(lab: AgentLab) -> None:
    with lab.near.client() as c:
        c.set("sec:differs", "near")
        c.wait(1, 10_000)
    with lab.far.client() as c:
        c.set("sec:differs", "far")
    path = lab.config("coordinator.toml")
    checked = replag("repair", "check", "-c", str(path), "--json")
    assert checked.returncode == 1, checked.stderr
    report = json.loads(checked.stdout)
    assert {r["replica"]: r["via"] for r in report["replicas"]}["f"].startswith("agent")
    repaired = replag("repair", "run", "-c", str(path), "--policy", "source:n", "--json")
    assert repaired.returncode == 0, repaired.stderr
    run_id = json.loads(repaired.stdout)["run_id"]
    with lab.far.client() as c:
        assert c.get("sec:differs") == b"near"

    # The write is in the agent's log and its audit file, under the coordinator's token
    # and the run's id; never a secret.
    log = (lab.dir / "agent.log").read_text()
    line = next(x for x in log.splitlines() if "repair write of 'sec:differs'" in x)
    assert "replag.audit" in line and "by token 'coordinator' from 127.0.0.1:" in line
    assert f"run={run_id}" in line and line.endswith(": written"), line
    rows = [
        json.loads(x) for x in (lab.dir / "state" / "far" / "audit.jsonl").read_text().splitlines()
    ]
    [row] = [r for r in rows if r["key"] == "sec:differs"]
    assert (row["token"], row["run"], row["replica"], row["op"], row["outcome"]) == (
        "coordinator",
        run_id,
        "f",
        "restore",
        "written",
    )

    # A probe has the agent watch its keys over the same mutual TLS.
    probed = replag("probe", "-c", str(path), "--count", "5", "--json")
    assert probed.returncode == 0, probed.stderr
    answer = json.loads(probed.stdout)
    [agent] = answer["agents"]
    assert agent["error"] is None, agent
    [pair] = answer["pairs"]
    assert pair["observed_by"].startswith("agent/") and pair["seen"] == 5, pair
    assert not [s for s in (COORDINATOR, GRAFANA, CHECKER) if s in log + probed.stdout]


def test_a_token_of_a_narrower_scope_cannot_make_the_agent_write(lab: AgentLab) -> None:
    base = f"https://127.0.0.1:{lab.port}/agent/v1"
    key = keys_to_wire([b"sec:scoped"])[0]
    write = {"key": key, "expected": None, "tolerance_ms": 1000, "age_ms": 0,
             "write": {"op": "delete", "pttl": -1}}  # fmt: skip
    calls = [
        ("GET", "/replicas", None),
        ("POST", "/replicas/f/nodes", {"level": 0, "nodes": [0], "down": 1}),
        ("POST", "/replicas/f/keys/read-for-copy", {"key": key, "expected": None,
                                                    "tolerance_ms": 1000}),
        ("POST", "/replicas/f/keys/write", write),
    ]  # fmt: skip
    expected = {
        GRAFANA: [200, 403, 403, 403],
        CHECKER: [200, 200, 403, 403],
        COORDINATOR: [200, 200, 200, 200],
    }
    with httpx.Client(verify=lab.client_context(), timeout=60) as http:
        for token, statuses in expected.items():
            got = [
                http.request(method, base + path, json=body,
                             headers={"Authorization": f"Bearer {token}"}).status_code
                for method, path, body in calls
            ]  # fmt: skip
            assert got == statuses, token
        refused = http.post(base + "/replicas/f/keys/write", json=write,
                            headers={"Authorization": f"Bearer {GRAFANA}"})  # fmt: skip
        assert refused.json()["detail"] == "token 'grafana' lacks the repair scope (it has read)"
    # Without a client certificate the agent does not even finish the handshake's work.
    with (
        httpx.Client(verify=lab.client_context(cert=False), timeout=60) as http,
        pytest.raises(httpx.HTTPError),
    ):
        http.get(base + "/health")
    log = (lab.dir / "agent.log").read_text()
    assert "token lacks the repair scope" in log and "by token 'grafana'" in log
    assert GRAFANA not in log


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("wrong CA", "TLS: the agent's certificate is signed by an unknown CA (not the CA in"),
        ("expired", "TLS: the agent's certificate has expired"),
        ("wrong name", "TLS: the agent's certificate is not valid for 'wrong.example'"),
        ("no client certificate", "TLS: the agent requires a client certificate"),
        (
            "untrusted client certificate",
            "TLS: the agent closed the connection after the handshake: it refused our client ",
        ),
    ],
)
def test_agent_certificate_failures_are_one_line_and_exit_2(
    lab: AgentLab, case: str, fragment: str
) -> None:
    url = f"https://127.0.0.1:{lab.port}"
    agent: dict[str, Any] = {"url": url}
    settings: dict[str, Any] = {}
    if case == "wrong CA":
        agent["tls_ca"] = str(lab.pki.other_ca)
    elif case == "expired":
        url = agent["url"] = f"https://127.0.0.1:{lab.expired_port}"
    elif case == "wrong name":
        agent["tls_server_name"] = "wrong.example"
    elif case == "no client certificate":
        settings = {"agent_tls_client_cert": None, "agent_tls_client_key": None}
    else:
        agent |= {"tls_cert": str(lab.pki.stranger_cert), "tls_key": str(lab.pki.stranger_key)}
    path = lab.config(f"bad-{case.replace(' ', '-')}.toml", agent=agent, **settings)
    commands = [("repair", "check", "-c", str(path))]
    if case == "wrong CA":  # the probe stops on it too, rather than watching across the WAN
        commands.append(("probe", "-c", str(path), "--count", "3"))
    for command in commands:
        result = replag(*command)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, result.stderr
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"replag: error: {url}: {fragment}"), lines[0]


def test_an_agent_refuses_to_start_on_bad_tls_settings_or_no_token(lab: AgentLab) -> None:
    missing = lab.dir / "missing.pem"
    cases = {
        "no-token": ({"agent_token": None}, "replag agent needs a token"),
        "client-ca-without-cert": (
            {"agent_tls_cert": None, "agent_tls_key": None},
            "agent_tls_client_ca is set without agent_tls_cert",
        ),
        "bad-cert": (
            {"agent_tls_cert": str(lab.pki.ca), "agent_tls_key": str(lab.pki.client_key)},
            f"cannot load the certificate {lab.pki.ca}",
        ),
        "missing-ca": (
            {"agent_tls_client_ca": str(missing)},
            f"cannot load the client CA {missing}",
        ),
    }
    for name, (settings, fragment) in cases.items():
        path = lab.config(f"start-{name}.toml", **settings)
        if name == "no-token":
            data = path.read_text().split("[[api_tokens]]")[0]
            path.write_text(data)
        result = replag("agent", "-c", str(path), "--region", "far", "--listen",
                        f"127.0.0.1:{free_port()}")  # fmt: skip
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, (name, result.stderr)
        assert fragment in lines[0], lines[0]
