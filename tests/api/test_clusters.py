"""`?cluster=` on the lag, matrix, health, replication and alerts endpoints, in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from replag.api.app import create_app
from replag.config import config_from_dict
from replag.store import Store
from tests.helpers.lag_windows import add_windows


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """Two clusters of a region each (a primary and a replica), one pair each."""
    store = Store(tmp_path / "s.sqlite")
    add_windows(store, pairs=[("a", "a", 5.0), ("b", "b", 300.0)])
    data = {
        "settings": {"store": str(tmp_path / "s.sqlite")},
        "regions": [
            {"name": name, "cluster": f"c-{name}", "write": f"redis://127.0.0.1:{port}",
             "replicas": [f"redis://127.0.0.1:{port + 1}"]}
            for name, port in (("a", 1), ("b", 3))
        ],
        "alerts": {"rules": [{"name": "lag", "kind": "lag_p99", "threshold": "100ms"}]},
    }  # fmt: skip
    config = config_from_dict(data, where="replag.toml", environ={})
    app = create_app(config, store=store, run_schedulers=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replag") as c:
            yield c


async def test_each_endpoint_keeps_the_clusters_regions(client: httpx.AsyncClient) -> None:
    everything = (await client.get("/api/v1/lag/matrix", params={"since": "1h"})).json()
    assert everything["cluster"] is None and everything["clusters"] == ["c-a", "c-b"]
    assert {c["source"] for c in everything["cells"]} == {"a", "b"}

    matrix = await client.get("/api/v1/lag/matrix", params={"since": "1h", "cluster": "c-b"})
    body = matrix.json()
    assert body["cluster"] == "c-b" and body["regions"] == ["b"]
    assert [(c["source"], c["colour"]) for c in body["cells"]] == [("b", "warning")]

    lag = (await client.get("/api/v1/lag", params={"since": "1h", "cluster": "c-a"})).json()
    assert [p["source"] for p in lag["pairs"]] == ["a"] and lag["cluster"] == "c-a"

    health = (await client.get("/api/v1/health", params={"cluster": "c-a"})).json()
    assert {p["source"] for p in health["pairs"]} == {"a"}
    assert all(p.get("source") in (None, "a") for p in health["problems"])

    replication = (await client.get("/api/v1/replication", params={"cluster": "c-a"})).json()
    assert replication["cluster"] == "c-a" and replication["clusters"] == ["c-a", "c-b"]
    alerts = (await client.get("/api/v1/alerts", params={"cluster": "c-a"})).json()
    assert alerts["cluster"] == "c-a"


async def test_an_unknown_cluster_is_a_404_naming_the_known_ones(
    client: httpx.AsyncClient,
) -> None:
    for path in ("/api/v1/lag/matrix", "/api/v1/lag", "/api/v1/health", "/api/v1/replication",
                 "/api/v1/alerts"):  # fmt: skip
        answer = await client.get(path, params={"cluster": "nope"})
        assert answer.status_code == 404, path
        assert answer.json()["detail"] == "cluster: unknown cluster 'nope' (known: c-a, c-b)"


def test_a_matrix_answer_holds_while_its_range_keeps_the_same_windows(tmp_path: Path) -> None:
    """What makes the matrix's kept answer current (`LagIndex.edges`): the same generation,
    and a range whose ends have crossed no window's end."""
    from replag.lagindex import LagIndex

    store = Store(tmp_path / "s.sqlite")
    minute = 60 * 10**9
    end = 1_800_000_000 * 10**9
    add_windows(store, pairs=[("a", "a", 5.0)], minutes=10, end_ns=end)  # ends end-9m … end
    index = LagIndex(store)
    since, until = end - 5 * minute + 1, end + 1  # the last five windows
    generation, signature, edges = index.edges(since_ns=since, until_ns=until)
    assert [hi - lo for *_, lo, hi in signature] == [5]
    assert edges.hold(since + minute // 2, until + minute // 2)  # half a minute later
    assert not edges.hold(since + minute, until + minute)  # the oldest window left
    assert not edges.hold(since - minute, until)  # one more window came in
    add_windows(store, pairs=[("a", "a", 5.0)], minutes=1, end_ns=end + minute)
    index.refresh()
    assert index.generation != generation  # a new window: a new answer
    store.close()
