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
    primary_port = next(p["port"] for p in state["processes"] if p["role"] == "primary")
    with redis.Redis(port=primary_port) as client:
        client.set("k", "x" * 1000)
    # b-1 is up and catches up within its 2 ms; a-1 is cut off and not a candidate.
    result = check(state, "--max-bytes", "0")
    found = answer(result)
    (primary,) = found["primaries"]
    assert [c["replica"] for c in primary["candidates"]] == ["b-1", "a-1"]
    assert primary["candidates"][1]["eligible"] is False
    assert (result.exit_code == 0) == (primary["rpo_bytes"] == 0)


def test_unreachable_primary_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        '[[regions]]\nname = "a"\nwrite = "redis://127.0.0.1:1"\n'
        'replicas = ["redis://127.0.0.1:2"]\n[settings]\nconnect_timeout = "200ms"\n'
    )
    result = CliRunner().invoke(main, ["failover-check", "--config", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert "a-write" in line and "127.0.0.1:1" in line


def test_bad_max_bytes_is_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[[regions]]\nname = "a"\nwrite = "redis://127.0.0.1:1"\nreplicas = []\n')
    result = CliRunner().invoke(
        main, ["failover-check", "--config", str(path), "--max-bytes", "lots"]
    )
    assert result.exit_code == 2 and "--max-bytes" in result.stderr


def test_dynomite_only_topology_has_nothing_to_check(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        '[[regions]]\nname = "dc1"\nwrite = "redis://127.0.0.1:8102"\nwrite_kind = "dynomite"\n'
        'replicas = ["redis://127.0.0.1:22122"]\n'
    )
    result = CliRunner().invoke(main, ["failover-check", "--config", str(path)])
    assert result.exit_code == 2
    assert "no Redis primary to check" in result.stderr and "Dynomite" in result.stderr
