"""`replag topology discover` end to end: real HTTP fixture servers and real redis-servers."""

from __future__ import annotations

import stat
from pathlib import Path

from click.testing import CliRunner

from replag.cli import main
from replag.config import load_config
from tests.helpers.dynomite_admin import admin_server_in_thread, node_routes
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed

THREE_RACK_PORTS = [
    "127.0.0.1:8101=client:8102,redis:22121,stats:22222",
    "127.0.0.1:8111=client:8112,redis:22122,stats:22232",
    "127.0.0.1:8121=client:8122,redis:22123,stats:22242",
]


def test_dynomite_discovery_prints_the_toml(tmp_path: Path) -> None:
    args = [arg for spec in THREE_RACK_PORTS for arg in ("--port-map", spec)]
    with admin_server_in_thread(node_routes("3rack", "node1")) as url:
        result = CliRunner().invoke(main, ["topology", "discover", "--dynomite", url, *args])
    assert result.exit_code == 0, result.output
    path = tmp_path / "printed.toml"
    path.write_text(result.stdout)
    topology = load_config(path, environ={}).topology
    (region,) = topology.regions
    assert region.write is not None and (region.write.kind, region.write.port) == ("dynomite", 8102)
    assert [r.port for r in region.replicas] == [22121, 22122, 22123]
    assert [g.name for g in topology.groups] == ["token-12345678"]


def test_discovery_says_where_state_goes_in_the_output_and_the_file(tmp_path: Path) -> None:
    args = [arg for spec in THREE_RACK_PORTS for arg in ("--port-map", spec)]
    out = tmp_path / "dyn.toml"
    default = tmp_path / "state" / "default.sqlite"
    with admin_server_in_thread(node_routes("3rack", "node1")) as url:
        mine_arg = ["--store", str(tmp_path / "mine.sqlite")]
        chosen = CliRunner().invoke(
            main, ["topology", "discover", "--dynomite", url, "--out", str(out), *args, *mine_arg]
        )
        printed = CliRunner().invoke(
            main,
            ["topology", "discover", "--dynomite", url, *args],
            env={"REPLAG_STORE": str(default)},
        )
    assert chosen.exit_code == 0, chosen.output
    mine = str((tmp_path / "mine.sqlite").resolve())
    assert f"results store (state of probe, repair, serve): {mine}" in chosen.stderr
    assert load_config(out, environ={}).settings.store == mine
    assert f"# Results store (lag windows, repair runs, alert state): {mine}" in out.read_text()
    # Without --store: settings.store (here from the environment), said and written.
    assert printed.exit_code == 0, printed.output
    assert f'store = "{default}"' in printed.stdout
    assert str(default) in printed.stderr


def test_dynomite_discovery_with_a_port_map_file_and_conventions(tmp_path: Path) -> None:
    ports = tmp_path / "ports.toml"
    ports.write_text(
        "[conventions]\npeer_port = 8201\n\n"
        '[nodes."127.0.0.1:8201"]\nclient = 8202\nredis = 22131\nstats = 22252\n\n'
        '[nodes."127.0.0.1:8211"]\nclient = 8212\nredis = 22132\nstats = 22262\n'
    )
    out = tmp_path / "dyn.toml"
    with admin_server_in_thread(node_routes("2dc", "node1")) as url:
        result = CliRunner().invoke(
            main,
            [
                "topology",
                "discover",
                "--dynomite",
                url,
                "--port-map-file",
                str(ports),
                "--out",
                str(out),
            ],
        )
    assert result.exit_code == 0, result.output
    assert "2 regions, 1 replica group; Dynomite consistency read DC_ONE" in result.stderr
    assert [r.name for r in load_config(out, environ={}).topology.regions] == ["dc1", "dc2"]


def test_dynomite_errors_exit_2_naming_the_url() -> None:
    routes = node_routes("3rack", "node1")
    routes["/cluster_describe"] = b'{"dcs": "none"}'
    with admin_server_in_thread(routes) as url:
        result = CliRunner().invoke(main, ["topology", "discover", "--dynomite", url])
    assert result.exit_code == 2
    assert f"replag: error: {url}/cluster_describe: no `dcs` list" in result.stderr


def test_redis_discovery_writes_the_file(redis_factory: RedisFactory, tmp_path: Path) -> None:
    primary = redis_factory("primary")
    replica = replica_of(redis_factory, primary, "replica")
    wait_listed(primary, [replica])
    out = tmp_path / "redis.toml"
    result = CliRunner().invoke(
        main, ["topology", "discover", "--redis", primary.url, "--out", str(out), "--timeout", "2s"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    (region,) = load_config(out, environ={}).topology.regions
    assert [r.port for r in region.replicas] == [replica.port]


def test_usage_errors() -> None:
    runner = CliRunner()
    for args in (
        [],
        ["--redis", "redis://a", "--cluster", "redis://b"],
        ["--redis", "redis://a", "--port-map", "127.0.0.1:8101=client:1"],
        ["--redis", "redis://a", "--timeout", "soon"],
        ["--dynomite", "http://127.0.0.1:1", "--port-map", "nonsense"],
    ):
        result = runner.invoke(main, ["topology", "discover", *args])
        assert result.exit_code == 2, (args, result.output)
        assert result.stderr.startswith("replag: error: ") or "Usage:" in result.output


def test_printed_topology_never_shows_a_password(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    primary = redis_factory("secure", password="s3cret-pw")
    replica = replica_of(redis_factory, primary, "secure-replica")
    wait_listed(primary, [replica])
    printed = CliRunner().invoke(main, ["topology", "discover", "--redis", primary.url])
    assert printed.exit_code == 0, printed.output
    assert "s3cret-pw" not in printed.output
    assert not [line for line in printed.stdout.splitlines() if "***" in line and line[:1] != "#"]
    # The printed file works: it names the variable to set (a comment says so), and with it
    # set, it reaches the servers (no WRONGPASS from a `***` password).
    assert 'password_env = "REPLAG_REDIS_PASSWORD"' in printed.stdout
    assert "# The servers' password is not printed: set REPLAG_REDIS_PASSWORD" in printed.stdout
    path = tmp_path / "printed.toml"
    path.write_text(printed.stdout)
    env = {"REPLAG_REDIS_PASSWORD": "s3cret-pw", "REPLAG_STORE": str(tmp_path / "s.db")}
    used = CliRunner(env=env).invoke(main, ["repair", "check", "-c", str(path)])
    assert used.exit_code == 0, used.output
    out = tmp_path / "secure.toml"
    written = CliRunner().invoke(
        main, ["topology", "discover", "--redis", primary.url, "--out", str(out)]
    )
    assert written.exit_code == 0 and "s3cret-pw" not in written.output
    (region,) = load_config(out, environ={}).topology.regions
    assert region.write is not None and region.write.password == "s3cret-pw"
