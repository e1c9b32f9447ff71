"""Every `--json` output carries schema_version and validates against its published schema."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from replag.lab.server import RedisServer, free_port
from replag.schemas import SCHEMA_VERSION, SCHEMAS, schema
from tests.helpers.cli import run_replag
from tests.helpers.redis_servers import FAST_SYNC, primary_and_replicas
from tests.helpers.waiting import wait_until


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisServer]]:
    with primary_and_replicas(tmp_path_factory.mktemp("contracts")) as started:
        yield started


@pytest.fixture(scope="module")
def config(servers: list[RedisServer], tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("contracts-config")
    path = where / "replag.toml"
    replag(["topology", "discover", "--redis", servers[0].url, "--out", str(path)], where)
    with servers[0].client() as client:
        client.mset({f"user:{n}": n for n in range(50)})
    return path


def replag(args: list[str], where: Path, expect: int = 0) -> str:
    done = run_replag(*args, timeout=120, env={"REPLAG_STORE": str(where / "store.sqlite")})
    assert done.returncode == expect, done.stdout + done.stderr
    return done.stdout


def valid(name: str, text: str) -> dict[str, Any]:
    document = json.loads(text)
    jsonschema.validate(document, schema(name), format_checker=jsonschema.FormatChecker())
    assert document["schema_version"] == SCHEMA_VERSION
    return document


def test_every_schema_is_a_valid_json_schema() -> None:
    for name in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema(name))


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("probe", ["probe", "--count", "20", "--json"]),
        ("check", ["repair", "check", "--json"]),
        ("repair", ["repair", "run", "--dry-run", "--json"]),
        ("failover-check", ["failover-check"]),
        ("failover-check", ["failover-check", "--json"]),  # as the README shows it
        ("runs", ["repair", "runs", "--json"]),
    ],
)
def test_real_outputs_validate(name: str, args: list[str], config: Path) -> None:
    if name == "runs":  # at least one run to list, whichever worker runs this
        replag(["repair", "check", "-c", str(config)], config.parent)
    document = valid(name, replag([*args, "-c", str(config)], config.parent))
    if name == "runs":
        assert document["runs"]
    # Strict: a field the schema does not name is refused, at the top and inside the
    # typed parts (a pair's replication state, a group, a run's report and params).
    nested = {
        "probe": [("pairs", 0), ("pairs", 0, "replication"), ("replication", "primaries", 0)],
        "check": [("groups", 0), ("groups", 0, "replicas", 0)],
        "repair": [("groups", 0), ("groups", 0, "found")],
        "failover-check": [("primaries", 0), ("replication", "primaries", 0, "replicas", 0)],
        "runs": [("runs", 0), ("runs", 0, "report"), ("runs", 0, "params")],
    }[name]
    for path in [(), *nested]:
        changed = json.loads(json.dumps(document))
        where = changed
        for step in path:
            where = where[step]
        assert isinstance(where, dict), (name, path)
        where["surprise"] = 1
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(changed, schema(name))


def test_samples_out_lines_validate_against_their_schema(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "samples.jsonl"
    out.write_text("stale\n")
    out.chmod(0o644)  # a file that was there keeps no wider mode than the samples get
    probe = ["probe", "--count", "15", "--no-store", "--json", "--samples-out", str(out)]
    document = valid("probe", replag([*probe, "-c", str(config)], config.parent))
    assert out.stat().st_mode & 0o777 == 0o600
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    line_schema = schema("samples")
    for line in lines:
        jsonschema.validate(line, line_schema)
    # One line per write and replica, each matching a pair of the report.
    seen = {(p["replica"], p["sent"]) for p in document["pairs"]}
    by_replica: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_replica.setdefault(line["replica"], []).append(line)
    assert {(name, len(rows)) for name, rows in by_replica.items()} == seen
    for rows in by_replica.values():
        assert sorted(r["seq"] for r in rows) == list(range(15))
        assert all(r["key"].endswith(f":{r['seq']}") for r in rows)
        assert all(r["lag_ms"] is not None and r["stamp"] for r in rows)
    pair = document["pairs"][0]
    assert {r["mode"] for r in lines} == {pair["observed_by"]}
    assert {r["source"] for r in lines} == {document["source"]}


def test_schema_command_prints_each_schema(tmp_path: Path) -> None:
    for name in SCHEMAS:
        assert json.loads(replag(["schema", name], tmp_path)) == schema(name)


def _topology(where: Path, write: str, *replicas: str) -> Path:
    path = where / "t.toml"
    listed = ", ".join(f'"{url}"' for url in replicas)
    path.write_text(
        f'[settings]\nstore = "{where / "s.sqlite"}"\n'
        f'[[regions]]\nname = "a"\nwrite = "{write}"\nreplicas = [{listed}]\n'
    )
    return path


def test_an_unreachable_replica_exits_3_and_is_a_breach_too(
    servers: list[RedisServer], tmp_path: Path
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}"
    config = _topology(tmp_path, servers[0].url, servers[1].url, dead)
    out = valid(
        "probe", replag(["probe", "-c", str(config), "--count", "10", "--json"], tmp_path, 3)
    )
    assert [b["kind"] for b in out["breaches"]] == ["unreachable"]
    assert out["unreachable"][0]["replica"] in out["breaches"][0]["message"]
    probe = ["probe", "-c", str(config), "--count", "10", "--format", "nagios"]
    (line,) = replag(probe, tmp_path, 2).splitlines()
    assert line.startswith("REPLAG CRITICAL - 1 unreachable: ") and " | " in line
    perfdata = line.split(" | ")[1]
    shape = r"'[^'=]+'=(?:[\d.]+(?:ms|%)|U);[^;]*;[^;]*;[^;]*;[^; ]*"
    assert re.fullmatch(f"{shape}( {shape})*", perfdata), perfdata
    # The dead replica's loss is not known (U), never a healthy-looking 0%.
    dead_name = out["unreachable"][0]["replica"]
    assert f"{dead_name} lost'=U;" in perfdata, perfdata
    assert f"{dead_name} lost'=0%" not in perfdata


def test_nagios_ok_and_unknown(servers: list[RedisServer], tmp_path: Path) -> None:
    config = _topology(tmp_path, servers[0].url, servers[1].url)
    line = replag(["probe", "-c", str(config), "--count", "10", "--format", "nagios"], tmp_path)
    assert line.startswith("REPLAG OK - 1 replica within limits") and "p99'=" in line
    missing = replag(
        ["probe", "-c", str(tmp_path / "nope.toml"), "--format", "nagios"], tmp_path, 3
    )
    assert missing.startswith("REPLAG UNKNOWN - ") and "nope.toml" in missing


def test_failover_check_nagios(servers: list[RedisServer], config: Path, tmp_path: Path) -> None:
    check = ["failover-check", "--format", "nagios", "--max-bytes", "64kb"]
    (line,) = replag([*check, "-c", str(config)], config.parent).splitlines()
    assert line.startswith("REPLAG OK - 1 primary safe to fail over: "), line
    perfdata = line.split(" | ")[1]
    assert re.fullmatch(r"'[^'=]+ rpo'=\d+B;;65536;0;( '[^'=]+ rpo_s'=[\d.]+s;;;0;)?", perfdata)
    # Its only replica down: nothing can be promoted (CRITICAL); no config: UNKNOWN.
    dead = _topology(tmp_path, servers[0].url, f"redis://127.0.0.1:{free_port()}")
    (line,) = replag([*check, "-c", str(dead)], tmp_path, 2).splitlines()
    assert line.startswith("REPLAG CRITICAL - a: no replica can be promoted"), line
    missing = replag([*check, "-c", str(tmp_path / "nope.toml")], tmp_path, 3)
    assert missing.startswith("REPLAG UNKNOWN - ") and "nope.toml" in missing


def test_a_failed_command_still_prints_its_json(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.toml")
    for name, args in [
        ("probe", ["probe", "-c", missing, "--json"]),
        ("check", ["repair", "check", "-c", missing, "--json"]),
        ("failover-check", ["failover-check", "-c", missing]),
        ("runs", ["repair", "runs", "-c", missing, "--json"]),
    ]:
        document = valid(name, replag(args, tmp_path, 2))
        assert document["exit_code"] == 2 and "nope.toml" in document["error"]


def test_a_usage_error_is_one_json_document_or_a_nagios_unknown(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.toml")
    for name, args, says in [
        ("probe", ["probe", "-c", missing, "--count", "0", "--json"], "--count"),
        ("check", ["repair", "check", "-c", missing, "--json", "--bogus"], "--bogus"),
        ("failover-check", ["failover-check", "-c", missing, "--bogus"], "--bogus"),
        ("runs", ["repair", "runs", "-c", missing, "--limit", "0", "--json"], "--limit"),
    ]:
        document = valid(name, replag(args, tmp_path, 2))
        assert document["exit_code"] == 2 and says in document["error"], document
    for args in (
        ["probe", "-c", missing, "--format", "nagios", "--count", "0"],
        ["failover-check", "-c", missing, "--format=nagios", "--bogus"],
    ):
        (line,) = replag(args, tmp_path, 3).splitlines()
        assert line.startswith("REPLAG UNKNOWN - usage: replag "), line


def test_refused_writes_are_one_warning_with_a_count(tmp_path: Path) -> None:
    # A primary out of memory refuses every probe write (OOM): one line, not one per write.
    with primary_and_replicas(tmp_path / "oom", replicas=1) as (primary, replica):
        with primary.client() as client:
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", "1")
        config = _topology(tmp_path, primary.url, replica.url)
        done = run_replag("probe", "-c", str(config), "--count", "50", "--json", timeout=120)
    assert done.returncode == 1, done.stderr
    out = valid("probe", done.stdout)
    assert out["write_ms"]["errors"] == 50 and out["breaches"][0]["kind"] == "write_errors"
    (line,) = done.stderr.splitlines()
    assert "50 of 50 probe writes" in line and "OOM" in line


def test_samples_taken_while_a_replica_syncs_are_flagged_and_kept_out(tmp_path: Path) -> None:
    primary = RedisServer(
        name="p",
        port=free_port(),
        workdir=tmp_path,
        # The first sync waits a minute before it starts: the replica stays in it.
        extra_args=("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "60"),
    ).start()
    replica_args = ("--replicaof", "127.0.0.1", str(primary.port))
    replica = RedisServer(name="r", port=free_port(), workdir=tmp_path, extra_args=replica_args)
    try:
        replica.start()
        config = _topology(tmp_path, primary.url, replica.url)
        args = ["probe", "-c", str(config), "--count", "10", "--timeout", "1s", "--json"]
        out = valid("probe", replag(args, tmp_path))
    finally:
        replica.stop()
        primary.stop()
    (pair,) = out["pairs"]
    assert pair["excluded"] == {"count": 10, "because": "syncing"}
    assert (pair["sent"], pair["lost"], pair["lag_ms"]["p99"]) == (0, 0, None)
    assert any("syncing" in note for note in out["notes"])


def test_a_replica_loading_its_snapshot_is_flagged_and_kept_out_not_unreachable(
    tmp_path: Path,
) -> None:
    # The replica loads the transferred snapshot (48 MB) key by key with a delay: minutes
    # of LOADING to reads, while it answers between keys (every 1 KB read).
    primary = RedisServer(name="p", port=free_port(), workdir=tmp_path, extra_args=FAST_SYNC)
    primary.start()
    slow_load = ("--key-load-delay", "50000", "--loading-process-events-interval-bytes", "1024")
    replica_args = ("--replicaof", "127.0.0.1", str(primary.port), *slow_load)
    replica = RedisServer(name="r", port=free_port(), workdir=tmp_path, extra_args=replica_args)
    try:
        with primary.client() as client:
            pipe = client.pipeline(transaction=False)
            for n in range(3000):
                pipe.set(f"fill:{n}", "x" * 16_000)
            pipe.execute()
        replica.start()
        with replica.client() as client:
            wait_until(lambda: client.info("persistence")["loading"] == 1, "the replica loads")
            config = _topology(tmp_path, primary.url, replica.url)
            args = ["probe", "-c", str(config), "--count", "10", "--timeout", "1s", "--json"]
            out = valid("probe", replag(args, tmp_path))
            # The whole run fell within the load (it lasts minutes).
            assert client.info("persistence")["loading"] == 1
    finally:
        replica.stop()
        primary.stop()
    (pair,) = out["pairs"]
    assert pair["excluded"] == {"count": 10, "because": "loading"}
    assert (pair["sent"], pair["lost"], pair["lag_ms"]["p99"]) == (0, 0, None)
    assert out["unreachable"] == [] and out["breaches"] == []  # and exit 0
    assert any("loading its dataset" in note for note in out["notes"]), out["notes"]
    (sampled,) = out["replication"]["primaries"][0]["replicas"]
    assert (sampled["status"], sampled["loading"]) == ("syncing", True)
