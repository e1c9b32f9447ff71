"""A real 3-rack Dynomite whose rack3 backend came back empty, rebuilt by `repair rebuild`
while clients keep writing through Dynomite (needs $REPLAG_DYNOMITE)."""

from __future__ import annotations

import threading
from pathlib import Path

from replag.repair import check
from replag.repair.rebuild import rebuild
from replag.store import Store
from tests.helpers.dynomite_cluster import DynomiteFactory, resp2_client
from tests.helpers.waiting import until

GROUP = "token-12345678"
KEYS = 4000


class Writers:
    """Clients writing through two racks' Dynomite ports, each key by one client in
    order (SET a new version, sometimes DEL): `last` is what every rack must end with."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.stop = threading.Event()
        self.last: dict[str, str | None] = {}
        self.writes = 0
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(len(ports))]

    def _run(self, index: int) -> None:
        version = 0
        with resp2_client(self.ports[index]) as client:
            while not self.stop.is_set():
                version += 1
                key = f"live:{index}:{version % 50}"
                if version % 7 == 0:
                    client.delete(key)
                    self.last[key] = None
                else:
                    client.set(key, f"v{version}")
                    self.last[key] = f"v{version}"
                self.writes += 1

    def __enter__(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


async def test_an_emptied_rack_is_rebuilt_while_clients_write_through_dynomite(
    dynomite_factory: DynomiteFactory, tmp_path: Path
) -> None:
    cluster = dynomite_factory()
    config = await cluster.discovered_config(
        tmp_path / "dyn.toml", REPLAG_STORE=str(tmp_path / "s.sqlite")
    )
    node1, node2, node3 = (cluster.node(f"node{i}") for i in (1, 2, 3))
    with resp2_client(node1.client_port) as client:
        pipe = client.pipeline(transaction=False)
        for i in range(KEYS):
            pipe.set(f"user:{i:05d}", f"profile {i}", px=3_600_000 if i % 10 == 0 else None)
        pipe.execute()
    backends = [n.backend.client() for n in (node1, node2, node3)]
    await until(
        lambda: all(int(b.dbsize()) >= KEYS for b in backends), "the load reached every rack"
    )
    backends[2].flushall()  # rack3's Redis restarted without persistence

    store = Store(config.settings.store)
    with Writers([node1.client_port, node2.client_port]) as writers:
        await until(lambda: writers.writes > 200, "clients write through Dynomite")
        report = await rebuild(config, group=GROUP, replica="dc1-rack3", store=store)
        during = writers.writes
    d = report.to_dict()
    assert d["copied"] >= KEYS - 100 and d["closing"] is not None
    assert during > 200

    # Every write Dynomite took reached every rack once the clients stop (DC_ONE, all
    # peers up); the anti-entropy pass left nothing the check can still see.
    async def settled() -> bool:
        return (await check(config, group=GROUP)).divergent == 0

    await until(settled, "the racks agree", timeout_s=60)
    for key, value in writers.last.items():  # never clobbered, never resurrected
        assert [b.get(key) for b in backends] == [None if value is None else value.encode()] * 3
    users = [f"user:{i:05d}" for i in range(KEYS)]
    assert backends[2].mget(users) == backends[0].mget(users)
    assert 0 < backends[2].pttl("user:00000") <= 3_600_000
    store.close()
