"""Where a run's config travels: the places (functions) that are handed it, in order.

`follow(config, ...)` profiles every call while it is active (`sys.setprofile`, and
in threads started meanwhile) and records each call of a replag function one of whose
arguments is `config`, or holds it: as an attribute, an item of a list, tuple or dict,
a bound method's object, a closure's variable, or one of those of those, up to `DEPTH`
steps down (a run-state object carrying the config counts as carrying it: hiding it
one object deeper is no fewer places). A coroutine counts once, when it starts, not
at each resume. Each object given gets its trail (the config, its settings, ...).

`Trail.places` are the distinct functions (`module:qualname`); `Trail.returns` counts
how often the config came back to a module it had already left (engine → group_run →
engine is one return). Run as a script, it starts three redis-servers, runs a check,
a repair and a rebuild, then a probe of a primary and its replica, and prints their
figures and trails:

    python3 -m tests.helpers.config_trail
"""

from __future__ import annotations

import asyncio
import dis
import inspect
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import CellType, CodeType, FrameType, FunctionType, MethodType
from typing import Any

from replag.config import Config, config_from_dict
from replag.lab.server import RedisServer
from replag.probes import run_probe
from replag.repair import check, repair
from replag.repair.rebuild import rebuild
from replag.store import Store
from tests.helpers.configs import group_config
from tests.helpers.redis_servers import primary_and_replicas, start_redis

# How many steps from an argument down to the config still count as "carrying" it.
DEPTH = 6
# Items of a list, tuple or dict looked at, per container.
_ITEMS = 64
_GENERATOR = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


@dataclass
class Trail:
    """The calls that were handed the config, in the order they were made."""

    calls: list[str] = field(default_factory=list)

    @property
    def places(self) -> list[str]:
        return list(dict.fromkeys(self.calls))

    @property
    def modules(self) -> list[str]:
        """The modules the config went through, a run of calls in one module counted once."""
        out: list[str] = []
        for call in self.calls:
            module = call.split(":")[0]
            if not out or out[-1] != module:
                out.append(module)
        return out

    @property
    def returns(self) -> int:
        """Entries into a module the config had already been in and left."""
        seen: set[str] = set()
        count = 0
        for module in self.modules:
            count += module in seen
            seen.add(module)
        return count

    def summary(self) -> str:
        lines = [f"places: {len(self.places)}, returns: {self.returns}"]
        lines += [f"  {p}" for p in self.places]
        lines.append(
            "modules in order: " + " -> ".join(m.removeprefix("replag.") for m in self.modules)
        )
        return "\n".join(lines)


def _first_offset(code: CodeType, cache: dict[CodeType, int]) -> int:
    """The offset at which a coroutine's or generator's frame first runs (its RESUME 0):
    a profile 'call' event at or before it starts the frame; a later one resumes it."""
    if code not in cache:
        cache[code] = next(
            (i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0
        )
    return cache[code]


def _filled(cell: CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # empty: its variable not yet assigned
        return False
    return True


def _holds(value: Any, target: object, depth: int, seen: set[int]) -> bool:
    if value is target:
        return True
    if depth == 0 or id(value) in seen or isinstance(value, (str, bytes, int, float, bool)):
        return False
    seen.add(id(value))
    if isinstance(value, (list, tuple, set, frozenset)):
        items: list[Any] = list(value)[:_ITEMS]
    elif isinstance(value, dict):
        items = list(value.values())[:_ITEMS]
    elif isinstance(value, MethodType):
        items = [value.__self__, value.__func__]
    elif isinstance(value, FunctionType):
        items = [cell.cell_contents for cell in value.__closure__ or () if _filled(cell)]
    else:
        items = list(getattr(value, "__dict__", {}).values())
        for name in getattr(type(value), "__slots__", ()):
            items.append(getattr(value, name, None))
    return any(_holds(item, target, depth - 1, seen) for item in items)


@contextmanager
def follow(*targets: object, package: str = "replag.") -> Iterator[list[Trail]]:
    """Record, while active, every call of a `package` function handed one of `targets`:
    one trail per target."""
    trails = [Trail() for _ in targets]
    first: dict[CodeType, int] = {}
    lock = threading.Lock()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not isinstance(module, str) or not module.startswith(package):
            return
        code = frame.f_code
        if code.co_flags & _GENERATOR and frame.f_lasti > _first_offset(code, first):
            return  # a coroutine resumed, not called
        n = code.co_argcount + code.co_kwonlyargcount
        n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
        local = frame.f_locals
        args = [local.get(name) for name in code.co_varnames[:n]]
        for target, trail in zip(targets, trails, strict=True):
            seen: set[int] = set()
            if any(_holds(arg, target, DEPTH, seen) for arg in args):
                with lock:
                    trail.calls.append(f"{module}:{code.co_qualname}")

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield trails
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


async def run_trails(
    workdir: Path, servers: Sequence[RedisServer], *, kind: str = "check"
) -> tuple[Trail, Trail]:
    """One check, repair or rebuild (of the last server, from the first) of group "g" over
    `servers`, with a store: the trail of its config, and that of the config's settings
    (a slice of it, for the record)."""
    config = group_config(workdir, servers)
    store = Store(workdir / "replag.sqlite")
    try:
        with follow(config, config.settings) as (trail, settings):
            if kind == "check":
                assert (await check(config, store=store)).divergent > 0
            elif kind == "repair":
                assert (await repair(config, store=store)).divergent > 0
            else:
                name, source = f"n{len(servers) - 1}", "n0"
                await rebuild(config, group="g", replica=name, store=store, source=source)
    finally:
        store.close()
    return trail, settings


def probe_config(workdir: Path, primary: RedisServer, replicas: Sequence[RedisServer]) -> Config:
    """Region "a" writing to `primary`, its `replicas` observed."""
    data = {
        "settings": {"store": str(workdir / "replag.sqlite"), "connect_timeout": "2s"},
        "regions": [
            {"name": "a", "write": primary.url, "replicas": [r.url for r in replicas]},
        ],
    }
    return config_from_dict(data, where="test")


async def probe_trail(
    workdir: Path, primary: RedisServer, replicas: Sequence[RedisServer], *, count: int = 5
) -> Trail:
    """One probe run (`run_probe`) from region "a", with a store: the trail of its config."""
    config = probe_config(workdir, primary, replicas)
    store = Store(workdir / "replag.sqlite")
    try:
        with follow(config) as (trail,):
            report = await run_probe(config, count=count, rate=200.0, store=store)
        assert report.pairs and not report.unreachable, report.unreachable
    finally:
        store.close()
    return trail


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        servers = [start_redis(f"t{i}", workdir / "redis") for i in range(3)]
        try:
            clients = [s.client() for s in servers]
            for client in clients:
                client.mset({f"k{i}": "v" for i in range(100)})
            clients[2].set("k1", "other")
            clients[2].set("only-c", "x")
            for kind in ("check", "repair", "rebuild"):
                if kind == "rebuild":  # the last replica wiped: a bulk copy, then a closing pass
                    clients[2].delete(*[f"k{i}" for i in range(100)], "only-c")
                trail, settings = asyncio.run(run_trails(workdir, servers, kind=kind))
                print(f"{kind}: the config:", trail.summary())
                print(f"{kind}: its settings:", settings.summary())
        finally:
            for s in servers:
                s.stop()
        with primary_and_replicas(workdir / "probe", replicas=1) as (primary, replica):
            probe = asyncio.run(probe_trail(workdir, primary, [replica]))
            print("probe: the config:", probe.summary())


if __name__ == "__main__":
    main()
