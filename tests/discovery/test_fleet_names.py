"""A fleet's names: `topology discover` takes every --redis/--cluster given, names each
replica set after its primary (or --name), and gives each file a store of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from replag.cli import main
from replag.config import load_config
from tests.helpers.redis_cluster import RedisClusterNodes, start_cluster
from tests.helpers.redis_servers import RedisFactory, replica_of, wait_listed


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisClusterNodes]:
    cluster = start_cluster(tmp_path / "cluster")
    yield cluster
    cluster.stop()


def discover(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["topology", "discover", *args])
    return result.exit_code, result.stdout, result.stderr


def test_two_primaries_and_a_cluster_get_distinct_names_and_stores(
    redis_factory: RedisFactory, redis_cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    a = redis_factory("a")
    b = redis_factory("b")
    a1, b1 = replica_of(redis_factory, a, "a1"), replica_of(redis_factory, b, "b1")
    wait_listed(a, [a1])
    wait_listed(b, [b1])
    out = tmp_path / "fleet.toml"
    code, _, err = discover(
        "--redis", a.url, "--redis", b1.url, "--cluster", redis_cluster.url, "--out", str(out)
    )
    assert code == 0, err
    config = load_config(out, environ={})
    names = [r.name for r in config.topology.regions]
    assert names[:2] == [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]  # b found from b1
    assert len(names) == len(set(names)) == 2 + 3
    assert [g.name for g in config.topology.groups][:2] == names[:2]
    # Each replica set is a cluster of its own: a probe from a expects its writes on a1 only.
    (to_a,) = config.topology.observed_from(config.topology.regions[0])
    assert to_a.name == names[0] and [r.port for r in to_a.replicas] == [a1.port]
    assert "2 regions" not in err and "5 regions, 5 replica groups" in err
    # A store of the file's own, named for it; another file gets another.
    store = config.settings.store
    assert Path(store).name.startswith("fleet-") and store.endswith(".sqlite")
    code, _, err = discover("--redis", a.url, "--out", str(tmp_path / "other.toml"))
    assert code == 0, err
    assert load_config(tmp_path / "other.toml", environ={}).settings.store != store


def test_the_same_set_twice_is_refused_by_name_and_name_names_one(
    redis_factory: RedisFactory, tmp_path: Path
) -> None:
    a = redis_factory("a")
    a1 = replica_of(redis_factory, a, "a1")
    wait_listed(a, [a1])
    code, _, err = discover("--redis", a.url, "--redis", a1.url)
    assert code == 2
    assert f"--redis {a1.url} and --redis {a.url} both found '127.0.0.1:{a.port}'" in err
    code, _, err = discover("--redis", a.url, "--redis", a1.url, "--name", "sessions")
    assert code == 2 and "--name names one --redis or --cluster" in err
    out = tmp_path / "sessions.toml"
    code, _, err = discover("--redis", a1.url, "--name", "sessions", "--out", str(out))
    assert code == 0, err
    topology = load_config(out, environ={}).topology
    assert [r.name for r in topology.regions] == ["sessions"]
    assert [g.name for g in topology.groups] == ["sessions"]
    assert "1 region, 1 replica group" in err
