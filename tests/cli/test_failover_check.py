"""`replag failover-check` on a real lab: safe before a partition, unsafe after, errors exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis
from click.testing import CliRunner, Result

from replag.cli import main
from replag.lab.cluster import lab_fault
from tests.helpers.lab import LabFactory
from tests.helpers.redis_servers import RedisFactory, primary_with_a_writable_replica


def check(state: dict[str, Any], *args: str) -> Result:
    return CliRunner().invoke(
        main, ["failover-check", "--config", str(Path(state["dir"]) / "topology.toml"), *args]
    )


def answer(result: Result) -> dict[str, Any]:
    # stdout is the JSON; the one-line verdicts go to stderr.
    return dict(json.loads(result.stdout))


def test_safe_before_a_partition_and_unsafe_after(
    server_kind: str, lab_factory: LabFactory
) -> None:
    state = lab_factory(regions=("a", "b"), delays_ms={"b": 2})
    before = check(state)
    assert before.exit_code == 0, before.output
    found = answer(before)
    assert found["safe"] is True
    (primary,) = found["primaries"]
    assert primary["safest"] in ("a-1", "b-1") and primary["rpo_bytes"] == 0
    assert "SAFE: a: fail over to" in before.stderr

    for region in ("a", "b"):
        lab_fault(Path(state["dir"]), region, "partition")
    primary_port = next(p["port"] for p in state["processes"] if p["role"] == "primary")
    with redis.Redis(port=primary_port) as client:
        client.set("written-during-the-partition", "x" * 1000)
    after = check(state, "--max-bytes", "100")
    assert after.exit_code == 1, after.output
    found = answer(after)
    assert found["safe"] is False
    (primary,) = found["primaries"]
    assert primary["safest"] is None and "none with its link up" in primary["verdict"]
    for candidate in primary["candidates"]:
        assert not candidate["eligible"] and candidate["status"] == "link-down"
        assert candidate["rpo_bytes"] > 1000  # the write above, at least
        assert candidate["rpo_s_from"] == "link down since"
    assert "UNSAFE: a:" in after.stderr


def test_max_bytes_decides_while_a_replica_is_behind(lab_factory: LabFactory) -> None:
    state = lab_factory(regions=("a", "b"), delays_ms={"b": 2})
    lab_fault(Path(state["dir"]), "a", "partition")
    # b-1 stays up but gets the write only 30 s later; a-1 is cut off: not a candidate.
    lab_fault(Path(state["dir"]), "b", "delay", delay_ms=30_000)
    primary_port = next(p["port"] for p in state["processes"] if p["role"] == "primary")
    with redis.Redis(port=primary_port) as client:
        client.set("k", "x" * 1000)
    strict = check(state, "--max-bytes", "0")
    assert strict.exit_code == 1, strict.output
    (primary,) = answer(strict)["primaries"]
    assert [c["replica"] for c in primary["candidates"]] == ["b-1", "a-1"]
    assert primary["candidates"][1]["eligible"] is False
    assert primary["safest"] == "b-1" and 1000 < primary["rpo_bytes"] < 1200
    lenient = check(state, "--max-bytes", "1kb")
    assert lenient.exit_code == 1, lenient.output  # 1000 bytes of value + the command > 1 KiB
    allowed = check(state, "--max-bytes", "64kb")
    assert allowed.exit_code == 0, allowed.output
    (primary,) = answer(allowed)["primaries"]
    assert primary["safe"] is True and primary["safest"] == "b-1" and primary["rpo_bytes"] > 1000


def test_unreachable_primary_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        '[[regions]]\nname = "a"\nwrite = "redis://127.0.0.1:1"\n'
        'replicas = ["redis://127.0.0.1:2"]\n[settings]\nconnect_timeout = "200ms"\n'
    )
    result = CliRunner().invoke(main, ["failover-check", "--config", str(path)])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["exit_code"] == 2  # stdout is JSON, failed or not
    (line,) = result.stderr.strip().splitlines()
    assert "a-write" in line and "127.0.0.1:1" in line


def test_bad_max_bytes_is_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[[regions]]\nname = "a"\nwrite = "redis://127.0.0.1:1"\nreplicas = []\n')
    result = CliRunner().invoke(
        main, ["failover-check", "--config", str(path), "--max-bytes", "lots"]
    )
    assert result.exit_code == 2 and "--max-bytes" in result.stderr
    assert "not a size: 'lots'" in result.stderr and len(result.stderr.splitlines()) == 1


def test_dynomite_only_topology_has_nothing_to_check(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        '[[regions]]\nname = "dc1"\nwrite = "redis://127.0.0.1:8102"\nwrite_kind = "dynomite"\n'
        'replicas = ["redis://127.0.0.1:22122"]\n'
    )
    result = CliRunner().invoke(main, ["failover-check", "--config", str(path)])
    assert result.exit_code == 2
    assert "no Redis primary to check" in result.stderr and "Dynomite" in result.stderr


def test_a_writable_replica_and_one_found_divergent_are_never_advised(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    primary, clean, stray = primary_with_a_writable_replica(redis_factory)
    out = tmp_path / "replag.toml"
    found = CliRunner().invoke(
        main, ["topology", "discover", "--redis", primary.url, "--out", str(out)]
    )
    assert found.exit_code == 0, found.output
    state = {"dir": str(tmp_path)}
    out.rename(tmp_path / "topology.toml")
    advised = answer(check(state))
    (assessed,) = advised["primaries"]
    by_name = {c["replica"]: c for c in assessed["candidates"]}
    writable = by_name[f"127.0.0.1:{stray.port}"]
    assert writable["read_only"] is False and not writable["eligible"]
    assert "writable (replica-read-only no)" in writable["reason"]
    assert assessed["safest"] == f"127.0.0.1:{clean.port}"
    assert by_name[f"127.0.0.1:{clean.port}"]["read_only"] is True

    with stray.client() as client:
        client.mset({f"stray:{n}": "x" for n in range(30)})
    config = str(tmp_path / "topology.toml")
    checked = CliRunner().invoke(main, ["repair", "check", "--config", config, "--json"])
    assert checked.exit_code == 1, checked.output
    run_id = json.loads(checked.stdout)["run_id"]
    advised = answer(check(state))
    by_name = {c["replica"]: c for c in advised["primaries"][0]["candidates"]}
    verdict = by_name[f"127.0.0.1:{stray.port}"]["last_check"]
    assert verdict["run_id"] == run_id and verdict["divergent_keys"] == 30
    assert f"check {run_id}" in by_name[f"127.0.0.1:{stray.port}"]["reason"]
    assert by_name[f"127.0.0.1:{clean.port}"]["last_check"]["divergent_keys"] == 0

    text = check(state, "--format", "text")
    assert text.exit_code == 0, text.output
    assert f"fail over to 127.0.0.1:{clean.port}" in text.stdout
    assert f"127.0.0.1:{stray.port}: passed over (writable" in text.stdout
    nagios = check(state, "--format", "nagios")
    assert nagios.stdout.startswith("REPLAG OK - ")
    assert f"passed over 127.0.0.1:{stray.port} (writable" in nagios.stdout
    assert "30 divergent keys" in nagios.stdout
