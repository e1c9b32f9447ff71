"""A Dynomite node's backend Redis, as its own `/info` names it.

`/info` lists, under the server pool (`dyn_o_mite`), one entry per backend
server keyed by its address (`"127.0.0.1:22122"`): discovery reads it there
rather than guessing from a port convention. A backend on the node's loopback
is reached at the node's own host.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from replag.discovery.http import fetch_json_object

_ADDRESS = re.compile(r"^(?P<host>[^\s:]+):(?P<port>\d{1,5})$")
_LOOPBACK_NAMES = ("localhost", "0.0.0.0")


def backend_from_info(info: Mapping[str, Any], *, node_host: str) -> tuple[str, int] | None:
    """(host, port) of the node's backend server in its `/info`, or None if it names none."""
    for pool in info.values():
        if not isinstance(pool, Mapping):
            continue
        for key, value in pool.items():
            found = _ADDRESS.match(str(key))
            if found is None or not isinstance(value, Mapping):
                continue
            host, port = found["host"], int(found["port"])
            if not 0 < port < 65536:
                continue
            if _loopback(host) and not _loopback(node_host):
                host = node_host  # the node's own loopback: reached at the node's address
            return host, port
    return None


def _loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def read_backend(stats: str, *, node_host: str, timeout_s: float) -> tuple[str, int] | None:
    """The backend the node whose stats port is `stats` (host:port) names in its `/info`
    (ReplagError when that cannot be read)."""
    info = await fetch_json_object(f"http://{stats}/info", timeout_s=timeout_s)
    return backend_from_info(info, node_host=node_host)
