"""Loading a config sets nothing process-wide in the wire: its limits travel on each
endpoint (`Endpoint.limits`, read by the `Connector`), so two configs loaded in one
process (the service's reload, a test's two) keep their own. Every global of every
`replag.wire` module is the same object, with the same value, before and after two
configs with other limits are loaded.
"""

from __future__ import annotations

import copy
import importlib
import pkgutil
import types
from pathlib import Path
from typing import Any

import replag.wire
from replag.config import config_from_dict
from replag.wire.connector import Connector


def _modules() -> list[types.ModuleType]:
    names = [m.name for m in pkgutil.iter_modules(replag.wire.__path__, "replag.wire.")]
    return [replag.wire, *(importlib.import_module(name) for name in names)]


def _globals() -> dict[str, tuple[int, Any]]:
    out: dict[str, tuple[int, Any]] = {}
    for module in _modules():
        for name, value in vars(module).items():
            if name.startswith("__") or name == "annotations":  # the module's own, __future__
                continue
            if isinstance(value, (types.ModuleType, types.FunctionType, type)):
                continue
            try:
                shown = copy.deepcopy(value)
                if shown != value:  # a sentinel object(): compared by identity only
                    shown = None
            except Exception:  # a socket, a lock: compared by identity only
                shown = None
            out[f"{module.__name__}.{name}"] = (id(value), shown)
    return out


def _config(tmp_path: Path, port: int, max_reply: str) -> Any:
    data = {
        "settings": {"store": str(tmp_path / "s.sqlite"), "max_reply_bytes": max_reply,
                     "max_info_bytes": "1MB", "max_unrequested_bytes": "64kB"},
        "regions": [{"name": "a", "write": f"redis://127.0.0.1:{port}", "replicas": []}],
    }  # fmt: skip
    return config_from_dict(data, where="test")


def test_loading_a_config_changes_no_global_of_the_wire(tmp_path: Path) -> None:
    before = _globals()
    small = _config(tmp_path, 1, "1MB")
    large = _config(tmp_path, 2, "64MB")
    after = _globals()
    changed = sorted(
        name
        for name in before.keys() | after.keys()
        if name not in before
        or name not in after
        or before[name][0] != after[name][0]
        or (before[name][1] is not None and before[name][1] != after[name][1])
    )
    assert changed == [], changed
    # Each config's endpoints carry its own limits, and their Connectors use them.
    small_write, large_write = small.topology.regions[0].write, large.topology.regions[0].write
    assert Connector(small_write, timeout_s=1).limits.max_bytes == 1 << 20
    assert Connector(large_write, timeout_s=1).limits.max_bytes == 64 << 20
