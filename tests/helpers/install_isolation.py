"""Installed as `sitecustomize` in tests/test_install.py's venv (stdlib and pip only):
that venv then imports nothing from a distribution replag does not declare.

The venv sees the test interpreter's site-packages, where the dependencies already are,
so they are not downloaded and installed again for every run. But a module there that
replag imports without declaring it would then be found: this finder, first on
`sys.meta_path`, makes every top-level module of a distribution outside replag's declared
dependencies (followed with their extras, without replag's own extras) missing, as in a
venv holding only what the wheel's requirements pulled in. An optional import (a `try:
import …` in a dependency) falls back as it would there; a needed one fails the run.
What it refused goes to stderr and, when $REPLAG_REFUSED_DIR is set, to a file there.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata as md
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name


def declared() -> set[str]:
    """replag's runtime dependencies and theirs, canonical names (extras followed)."""
    seen: dict[str, set[str]] = {}
    todo: list[tuple[str, set[str]]] = [("replag", set())]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in seen and extras <= seen[key]:
            continue
        seen[key] = seen.get(key, set()) | extras
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not any(
                req.marker.evaluate({"extra": e}) for e in {"", *seen[key]}
            ):
                continue
            todo.append((req.name, set(req.extras)))
    return set(seen)


class Undeclared(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._allowed: set[str] | None = None
        self._owners: dict[str, list[str]] = {}
        self._busy = False

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if path is not None or self._busy or name in sys.stdlib_module_names:
            return None  # submodules follow their package; stdlib is always there
        if self._allowed is None:
            self._busy = True  # reading the metadata imports modules of its own
            try:
                self._owners = md.packages_distributions()
                self._allowed = declared()
            finally:
                self._busy = False
        dists = {canonicalize_name(d) for d in self._owners.get(name, [])}
        if dists and not dists & self._allowed:
            where = os.environ.get("REPLAG_REFUSED_DIR")
            if where:
                with open(os.path.join(where, f"{os.getpid()}.txt"), "a") as out:
                    out.write(f"{name} {' '.join(sorted(dists))}\n")
            raise ModuleNotFoundError(f"No module named {name!r} (not declared by replag)")
        return None


sys.meta_path.insert(0, Undeclared())
