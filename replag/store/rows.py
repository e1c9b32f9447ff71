"""Rows as both backends return them: tuples whose columns are also attributes.

`row.run_id` reads a column by name (what new code should do: it survives a
column added or reordered), `row[0]` and unpacking still work, and a row equals
the plain tuple of its values. One class per column list, made once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import Any


class Row(tuple[Any, ...]):
    """One result row; its columns are attributes named as the query named them."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        # Only reached for a name that is not a column (columns are properties).
        raise AttributeError(f"no column {name!r} in this row (columns: {', '.join(self._fields)})")

    def asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))


class Rows(list[Row]):
    """A statement's rows, how many rows it changed (`rowcount`, -1 when unknown), and
    whether it was `deferred` (the store could not take the write: kept in memory)."""

    rowcount: int = -1
    deferred: bool = False


@functools.lru_cache(maxsize=512)
def row_type(names: tuple[str, ...]) -> type[Row]:
    """The Row class of a column list (a name like `COUNT(*)` is reachable by position only)."""
    namespace: dict[str, Any] = {"__slots__": (), "_fields": names}
    for position, name in enumerate(names):
        if name.isidentifier() and not hasattr(tuple, name) and name not in namespace:
            namespace[name] = property(itemgetter(position))
    return type("Row", (Row,), namespace)


def make_rows(
    names: Sequence[str] | None, values: Iterable[Sequence[Any]], rowcount: int = -1
) -> Rows:
    out = Rows()
    out.rowcount = rowcount
    if names is not None:
        kind = row_type(tuple(names))
        out.extend(kind(v) for v in values)
    return out
