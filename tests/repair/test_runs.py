"""Runs as a user meets them: a dead member, resuming, Ctrl-C, `repair runs`, --keys-out."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from replag.cli import main
from replag.errors import RepairError
from replag.lab.server import RedisServer, free_port
from replag.repair import RepairProgress, check, list_runs, repair
from replag.store import Store
from tests.helpers.cli import replag_argv, replag_env
from tests.helpers.configs import group_config
from tests.helpers.redis_servers import RedisFactory
from tests.helpers.waiting import until, wait_until


def _three(redis_factory: RedisFactory, missing_on_last: int = 0) -> list[RedisServer]:
    """Three replicas holding the same 50 keys; the last lacks `missing_on_last` more."""
    servers = [redis_factory("run") for _ in range(3)]
    for i, server in enumerate(servers):
        with server.client() as client:
            pipe = client.pipeline(transaction=False)
            for k in range(50):
                pipe.set(f"same:{k:04d}", "x")
            if i < 2:
                for k in range(missing_on_last):
                    pipe.set(f"gap:{k:05d}", "v")
            pipe.execute()
    return servers


def _config_file(tmp_path: Path, servers: list[RedisServer]) -> Path:
    """The TOML a user would write for `group_config`'s topology."""
    regions = "".join(
        f'[[regions]]\nname = "r{i}"\nreplicas = [{{name = "n{i}", url = "{s.url}"}}]\n'
        for i, s in enumerate(servers)
    )
    members = ", ".join(f'"n{i}"' for i in range(len(servers)))
    path = tmp_path / "replag.toml"
    path.write_text(
        f'[settings]\nstore = "{tmp_path / "replag.sqlite"}"\nrepair_settle = "10ms"\n\n'
        f'{regions}[[groups]]\nname = "g"\nmembers = [{members}]\n'
    )
    return path


def _scans(server: RedisServer) -> int:
    with server.client() as client:
        stats = client.info("commandstats")
    return int(stats.get("cmdstat_scan", {}).get("calls", 0))


def test_a_dead_member_fails_the_check_before_any_replica_is_scanned(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = _three(redis_factory)
    config = _config_file(tmp_path, servers)
    servers[2].stop()
    result = CliRunner().invoke(main, ["repair", "check", "-c", str(config)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "n2" in result.output and "unreachable" in result.output
    assert "nothing was scanned" in result.output
    assert [_scans(s) for s in servers[:2]] == [0, 0]
    (run,) = list_runs(Store(tmp_path / "replag.sqlite"))
    assert run["status"] == "failed" and "n2" in run["error"]


def test_a_check_that_failed_midway_is_resumed_by_check_and_keeps_its_exit_code(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = _three(redis_factory, missing_on_last=30)
    with servers[2].client() as client:
        client.save()  # so it comes back with its data
    config = group_config(tmp_path, servers)
    store = Store(tmp_path / "replag.sqlite")

    def kill_the_last(event: RepairProgress) -> None:
        if event.phase == "scan" and event.replica == "n1" and servers[2].pid is not None:
            servers[2].kill()

    with pytest.raises(RepairError) as failed:
        asyncio.run(check(config, store=store, progress=kill_the_last))
    run_id = list_runs(store)[0]["run_id"]
    assert f"replag repair check --resume {run_id}" in str(failed.value)
    store.close()
    servers[2].start()
    path = _config_file(tmp_path, servers)
    runner = CliRunner()
    wrong = runner.invoke(main, ["repair", "run", "-c", str(path), "--resume", run_id])
    assert wrong.exit_code == 2 and f"repair check -c {path} --resume {run_id}" in wrong.output
    resumed = runner.invoke(main, ["repair", "check", "-c", str(path), "--resume", run_id])
    assert resumed.exit_code == 1, resumed.output
    assert "30 divergent keys" in resumed.output


def test_keys_out_lists_every_divergent_key_as_json_lines(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = _three(redis_factory, missing_on_last=250)
    with servers[0].client() as client:
        client.set(b"\xff\xfe binary", "only here")
    out = tmp_path / "keys.jsonl"
    config = _config_file(tmp_path, servers)
    result = CliRunner().invoke(
        main, ["repair", "check", "-c", str(config), "--keys-out", str(out), "--json"]
    )
    assert result.exit_code == 1
    assert len(json.loads(result.output)["divergent_keys"]) == 100
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 251
    assert {line["kind"] for line in lines} == {"missing"}
    gap = next(line for line in lines if line["key"] == "gap:00007")
    assert gap["group"] == "g" and gap["replicas"]["n2"] == {"exists": False}
    assert gap["replicas"]["n0"]["exists"] is True and "key_b64" not in gap
    binary = next(line for line in lines if "key_b64" in line)
    assert base64.b64decode(binary["key_b64"]) == b"\xff\xfe binary"
    assert binary["key"] == "\\xff\\xfe binary"


async def test_a_resumed_repair_reads_again_what_it_had_repaired(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    # The last replica lacks 600 keys. It is killed mid-repair, after the first batch
    # of copies was recorded as repaired, and comes back from a snapshot taken before
    # the repair: it lacks them all again. The resumed run must not trust its record.
    servers = _three(redis_factory, missing_on_last=600)
    with servers[2].client() as client:
        client.save()
    config = group_config(tmp_path, servers)
    store = Store(tmp_path / "replag.sqlite")
    run = asyncio.create_task(repair(config, store=store, rate=400))
    last = redis.asyncio.Redis(port=servers[2].port)
    await until(lambda: _dbsize_at_least(last, 50 + 256 + 40), "the second batch is written")
    await last.aclose()
    servers[2].kill()
    with pytest.raises(RepairError):
        await run
    run_id = list_runs(store)[0]["run_id"]
    servers[2].start()
    with servers[2].client() as client:
        assert client.dbsize() == 50  # the old snapshot
    report = (await repair(config, store=store, resume=run_id)).to_dict()
    assert report["status"] == "done"
    assert report["reverified"] >= 256 and report["differed_again"] >= 256
    assert (await check(config)).divergent == 0
    store.close()


async def _dbsize_at_least(client: redis.asyncio.Redis, count: int) -> bool:
    return int(await client.dbsize()) >= count


def test_ctrl_c_names_the_run_and_the_command_that_resumes_it(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = _three(redis_factory, missing_on_last=300)
    config = _config_file(tmp_path, servers)
    process = subprocess.Popen(
        replag_argv("repair", "run", "-c", str(config), "--rate", "20"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=replag_env(),
        # A suite started in the background of a script (`cmd &`) ignores SIGINT, and
        # children inherit that: this one must take Ctrl-C as a terminal's user would.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    store = Store(tmp_path / "replag.sqlite")
    # Generous waits: a loaded host starts a Python process slowly; nothing here is timed.
    wait_until(lambda: bool(list_runs(store)), "the run is recorded", timeout_s=120)
    # Interrupted while it writes (at 20 keys/s, 300 keys take 15 s).
    with servers[2].client() as last:
        wait_until(lambda: int(last.dbsize()) > 50, "the repair writes", timeout_s=120)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    run_id = list_runs(store)[0]["run_id"]
    store.close()
    assert process.returncode == 130, stderr
    line = stderr.decode().strip()
    assert line == (
        f"replag: interrupted; run {run_id} is saved: "
        f"`replag repair run -c {config} --resume {run_id}`"
    )
    runner = CliRunner()
    listed = runner.invoke(main, ["repair", "runs", "-c", str(config), "--json"])
    assert listed.exit_code == 0
    (entry,) = json.loads(listed.output)["runs"]
    assert entry["status"] == "interrupted"
    assert entry["resume"] == f"replag repair run -c {config} --resume {run_id}"
    human = runner.invoke(main, ["repair", "runs", "-c", str(config)])
    assert run_id in human.output and "interrupted" in human.output
    assert f"resume: replag repair run -c {config} --resume {run_id}" in human.output
    resumed = runner.invoke(main, ["repair", "run", "-c", str(config), "--resume", run_id])
    assert resumed.exit_code == 0, resumed.output
    (done,) = json.loads(
        runner.invoke(main, ["repair", "runs", "-c", str(config), "--json"]).output
    )["runs"]
    assert (done["status"], done["resume"]) == ("done", None)


async def test_library_reports_the_unreachable_member_by_name(
    tmp_path: Path, redis_factory: RedisFactory
) -> None:
    servers = _three(redis_factory)
    servers[1].stop()
    servers[2].port = free_port()
    with pytest.raises(RepairError) as failed:
        await check(group_config(tmp_path, servers))
    assert "n1" in str(failed.value) and "also failing" in str(failed.value)
