"""The package's layers point one way: a module imports only from its own layer or below.

    values         errors, durations, histogram, clock, clockbound, schemas, tokens, logfields,
                   private_files, tracing, docs_pictures, plural, _scanindex (the C extension)
    configuration  settings, wire.reply_limits, topology, validation, config_security,
                   config_tables, config
                   (+ alerts.config and alerts.tables: the [alerts] values and tables;
                   store.location: what settings.store names), `replag`
    io             wire (every connection to a Redis-protocol server: resp, resp_blocking,
                   stamped_socket, connections, tls, permissions), store, discovery.http,
                   background, heap, request_bodies, http_guard
    components     discovery, monitoring, replication, lagindex, probes, repair, lab,
                   alerts, metrics, prometheus_mixin, grafana_dashboard, otlp, agent
    service → api → cli (commands, docs_gen)

Components may use each other, but their packages never form a cycle. Every import
counts (also inside functions and under TYPE_CHECKING), and nothing is imported by
name at run time (`import_module`), so what this test reads is what runs. Below the
packages, no two modules anywhere import each other, directly or round a longer loop
(imports under TYPE_CHECKING, which never run, aside; one inside a function counts).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "replag"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "values",
        (
            "replag.errors",
            "replag.durations",
            "replag.histogram",
            "replag.clock",
            "replag.clockbound",
            "replag.schemas",
            "replag.tokens",
            "replag.logfields",
            "replag.private_files",
            "replag.tracing",
            "replag.docs_pictures",
            "replag.plural",
            "replag._scanindex",
        ),
    ),
    (
        "configuration",
        (
            "replag",
            "replag.settings",
            "replag.wire.reply_limits",
            "replag.store.location",
            "replag.topology",
            "replag.validation",
            "replag.alerts.config",
            "replag.alerts.tables",
            "replag.config_security",
            "replag.config_tables",
            "replag.config",
        ),
    ),
    (
        "io",
        (
            "replag.wire",
            "replag.store",
            "replag.discovery.http",
            "replag.background",
            "replag.heap",
            "replag.request_bodies",
            "replag.http_guard",
        ),
    ),
    (
        "components",
        (
            "replag.discovery",
            "replag.monitoring",
            "replag.replication",
            "replag.lagindex",
            "replag.probes",
            "replag.repair",
            "replag.lab",
            "replag.alerts",
            "replag.metrics",
            "replag.prometheus_mixin",
            "replag.grafana_dashboard",
            "replag.otlp",
            "replag.agent",
        ),
    ),
    ("service", ("replag.service",)),
    ("api", ("replag.api",)),
    ("cli", ("replag.commands", "replag.cli", "replag.__main__", "replag.docs_gen")),
)


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module
    line: int

    def __str__(self) -> str:
        return f"{self.module} (line {self.line}) imports {self.target}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
# Modules without a .py: the C extension (its stub is replag/_scanindex.pyi). It imports
# nothing of replag, so it sits with the values.
EXTENSIONS = frozenset({"replag._scanindex"})


@functools.cache
def tree(name: str) -> ast.Module:
    """The module's syntax tree, parsed once per process: every test here reads them all."""
    return ast.parse(MODULES[name].read_text(encoding="utf-8"))


@functools.cache
def imports() -> tuple[Import, ...]:
    return tuple(_imports())


def _imports() -> Iterator[Import]:
    for name in MODULES:
        for node in ast.walk(tree(name)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from replag.repair import engine` imports the module replag.repair.engine
                named = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t if t in MODULES or t in EXTENSIONS else node.module for t in named]
            else:
                continue
            for target in targets:
                if target == "replag" or target.startswith("replag."):
                    yield Import(name, target, node.lineno)


@functools.cache
def place(module: str) -> tuple[int, str]:
    """(layer index, the entry it matched): the longest prefix wins; `replag` is exact."""
    best: tuple[int, str] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or (prefix != "replag" and module.startswith(prefix + "."))
            if matches and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and the docstring)")
    return best


def test_every_module_has_a_layer() -> None:
    for name in MODULES:
        place(name)


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = [
        f"{imp} ({LAYERS[place(imp.module)[0]][0]} → {LAYERS[place(imp.target)[0]][0]})"
        for imp in imports()
        if place(imp.target)[0] > place(imp.module)[0]
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_components_form_no_cycle() -> None:
    components = dict(LAYERS)["components"]
    edges: dict[str, set[str]] = {c: set() for c in components}
    for imp in imports():
        a, b = place(imp.module)[1], place(imp.target)[1]
        if a in edges and b in edges and a != b:
            edges[a].add(b)

    def cycle_from(start: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        for nxt in sorted(edges[start]):
            if nxt in path:
                return (*path[path.index(nxt) :], nxt)
            found = cycle_from(nxt, (*path, nxt))
            if found:
                return found
        return None

    for component in components:
        cycle = cycle_from(component, (component,))
        assert cycle is None, "components import each other in a cycle: " + " → ".join(cycle)


def test_nothing_is_imported_by_name_at_run_time() -> None:
    found = []
    for name in MODULES:
        for node in ast.walk(tree(name)):
            if isinstance(node, ast.Name | ast.Attribute):
                called = node.id if isinstance(node, ast.Name) else node.attr
                if called in ("import_module", "__import__"):
                    found.append(f"{name}: line {node.lineno}: {called}")
        found += [
            f"{name}: line {n.lineno}: a module-level __getattr__ hides what it imports"
            for n in tree(name).body
            if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"
        ]
    assert not found, "\n".join(found)


def _type_checking_lines(module: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(n.lineno for n in ast.walk(inner) if hasattr(n, "lineno"))
    return lines


def module_cycles() -> list[list[str]]:
    """Every set of modules that import each other round a loop (Tarjan's strongly
    connected components of the import graph, imports under TYPE_CHECKING left out)."""
    skipped = {name: _type_checking_lines(tree(name)) for name in MODULES}
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for imp in imports():
        known = imp.target in MODULES and imp.target != imp.module
        if known and imp.line not in skipped[imp.module]:
            edges[imp.module].add(imp.target)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in MODULES:
        if name not in order:
            visit(name)
    return cycles


def test_no_modules_import_each_other() -> None:
    cycles = module_cycles()
    assert not cycles, "modules importing each other round a loop:\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


# The repair room's sub-rooms, each with what it may use (arrows one way). The modules
# left directly in replag/repair/ (the runs: engine, group_run, runs, rebuild, ...) may
# use every sub-room; no sub-room uses them, nor the package's own __init__.
REPAIR_ROOMS: dict[str, frozenset[str]] = {
    "keyspace": frozenset(),
    "trees": frozenset({"keyspace"}),
    "scan": frozenset({"trees", "keyspace"}),
    "decisions": frozenset({"trees", "keyspace"}),
    "writes": frozenset({"decisions", "trees", "keyspace"}),
    "bulk": frozenset({"writes", "decisions", "scan", "trees", "keyspace"}),
}
REPAIR_TOP_MODULES_AT_MOST = 12


def _repair_room(module: str) -> str | None:
    """The sub-room of replag.repair that `module` is in; "" for the room's own top level;
    None outside replag.repair."""
    if module == "replag.repair":
        return ""
    if not module.startswith("replag.repair."):
        return None
    part = module.split(".")[2]
    return part if part in REPAIR_ROOMS else ""


def test_repair_sub_rooms_point_one_way() -> None:
    wrong = []
    for imp in imports():
        room, target = _repair_room(imp.module), _repair_room(imp.target)
        if not room or target is None or room == target:
            continue
        if target == "" or target not in REPAIR_ROOMS[room]:
            wrong.append(f"{imp} ({room} → {target or 'the runs at replag.repair'})")
    assert not wrong, "arrows between repair's sub-rooms the wrong way:\n" + "\n".join(wrong)


def test_repair_keeps_few_modules_at_its_top() -> None:
    top = sorted(p.stem for p in (PACKAGE / "repair").glob("*.py") if p.stem != "__init__")
    assert set(REPAIR_ROOMS) <= {p.name for p in (PACKAGE / "repair").iterdir() if p.is_dir()}
    assert len(top) <= REPAIR_TOP_MODULES_AT_MOST, f"{len(top)} modules at the top: {top}"
