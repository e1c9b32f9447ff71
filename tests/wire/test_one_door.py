"""No module outside `replag.wire` opens a socket or makes a Redis client: every connection
to a Redis-protocol server goes through the wire's door (`Connector`, `RespConnection`,
`BlockingConnection`, `async_client`), where TLS, limits, reply shapes and `Reach` apply.

Read from the source (every call, also inside functions): a call of socket.socket,
create_connection, create_server, socketpair, asyncio.open_connection/start_server, or
of redis-py's Redis, StrictRedis, RedisCluster, Sentinel or ConnectionPool.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "replag"

# What may open sockets without the door, and why: none of them is a client of a server
# replag observes. The lab runs real servers for tests and demos (its relays forward
# replication links; its harness talks to the servers it started), `serve` binds the
# HTTP server's listening socket.
EXCEPTIONS = {
    "replag/lab/relay.py": "the lab's delay relays (TCP forwarders between lab servers)",
    "replag/lab/server.py": "the lab starts redis-server processes and waits on their port",
    "replag/lab/cluster.py": "the lab sets up the Redis Cluster it started",
    "replag/lab/sentinel.py": "the lab drives the Sentinels it started",
    "replag/lab/safety/monitor.py": "the safety harness's MONITOR of a lab server",
    "replag/commands/serve.py": "the HTTP server's listening socket",
}


REDIS_CLIENTS = frozenset({"Redis", "StrictRedis", "RedisCluster", "Sentinel", "ConnectionPool"})
SOCKETS = frozenset({"socket", "create_connection", "create_server", "socketpair", "fromfd"})
LOOPS = frozenset({"open_connection", "start_server", "open_unix_connection"})


def _aliases(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """Module aliases (name → socket | asyncio | redis) and the names imported from redis."""
    modules: dict[str, str] = {}
    from_redis: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in ("socket", "asyncio", "redis"):
                    modules[alias.asname or alias.name] = root
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            root = node.module.split(".")[0]
            for alias in node.names:
                if root == "redis":
                    from_redis.add(alias.asname or alias.name)
                if root == "socket" and alias.name in SOCKETS:
                    from_redis.add(alias.asname or alias.name)  # a socket opener, by name
    return modules, from_redis


def _called(node: ast.Call, modules: dict[str, str], by_name: set[str]) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        owner = ast.unparse(func.value)
        kind = modules.get(owner) or modules.get(owner.split(".")[0])
        name = func.attr
        opens = (
            (kind == "socket" and name in SOCKETS)
            or (kind == "asyncio" and name in LOOPS)
            or (kind == "redis" and name in REDIS_CLIENTS)
            # an event loop's create_connection / create_server, whatever it is called
            or (kind is None and name in ("create_connection", "create_server"))
        )
        return f"{owner}.{name}" if opens else None
    if isinstance(func, ast.Name) and func.id in by_name and func.id in REDIS_CLIENTS | SOCKETS:
        return func.id
    return None


@functools.cache  # both tests read the same source: parsed once per process
def openers() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE.parent))
        if relative.startswith("replag/wire/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules, by_name = _aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (name := _called(node, modules, by_name)):
                found.setdefault(relative, []).append(f"line {node.lineno}: {name}")
    return found


def test_no_module_outside_the_wire_opens_a_socket_or_makes_a_redis_client() -> None:
    found = openers()
    unexpected = {path: calls for path, calls in found.items() if path not in EXCEPTIONS}
    assert not unexpected, "\n".join(f"{p}: {', '.join(c)}" for p, c in unexpected.items())


def test_every_exception_is_still_needed() -> None:
    found = openers()
    assert sorted(found) == sorted(EXCEPTIONS), sorted(found)
    assert len(EXCEPTIONS) == 6
