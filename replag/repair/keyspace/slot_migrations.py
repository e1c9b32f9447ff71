"""Valkey 9 atomic slot migrations (`CLUSTER MIGRATESLOTS`), as `CLUSTER GETSLOTMIGRATIONS`
lists them.

An atomic migration moves whole slot ranges without SETSLOT marks: the target takes
the slots' data in the background and ownership changes at the end, so CLUSTER
NODES shows nothing while it runs. `GETSLOTMIGRATIONS` (Valkey 9+) lists each
migration a node exports or imports, under way or recently finished, with its state.
A migration under way makes its slots moving for a check (not compared), and the
report names every migration seen during the run by its ranges and ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# States after which a migration moves nothing any more.
FINISHED = frozenset({"success", "failed", "cancelled", "canceled"})


@dataclass(frozen=True)
class SlotMigration:
    """One migration as a node lists it (`name` is shared by both ends)."""

    name: str
    operation: str  # EXPORT or IMPORT, as the node that listed it sees it
    slots: tuple[tuple[int, int], ...]
    source: str  # node ids
    target: str
    state: str

    @property
    def live(self) -> bool:
        return self.state not in FINISHED

    def slot_set(self) -> set[int]:
        return {s for a, b in self.slots for s in range(a, b + 1)}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _fields(entry: Any) -> dict[str, Any]:
    """One entry as a dict: a RESP3 map, or RESP2's flat [name, value, …] list."""
    if isinstance(entry, dict):
        return {_text(k): v for k, v in entry.items()}
    if isinstance(entry, list):
        return {_text(entry[i]): entry[i + 1] for i in range(0, len(entry) - 1, 2)}
    return {}


def _ranges(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in text.replace(",", " ").split():
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            out.append((int(first), int(last or first)))
    return tuple(out)


def parse_migrations(reply: Any) -> list[SlotMigration]:
    """The migrations of a GETSLOTMIGRATIONS reply (entries it cannot read are skipped)."""
    out = []
    for entry in reply if isinstance(reply, list) else []:
        f = _fields(entry)
        slots = _ranges(_text(f.get("slot_ranges", "")))
        if not slots or "name" not in f:
            continue
        out.append(
            SlotMigration(
                name=_text(f["name"]),
                operation=_text(f.get("operation", "")),
                slots=slots,
                source=_text(f.get("source_node", "")),
                target=_text(f.get("target_node", "")),
                state=_text(f.get("state", "")),
            )
        )
    return out


def during_run(before: list[SlotMigration], later: list[SlotMigration]) -> dict[str, SlotMigration]:
    """Migrations that moved slots while the run went on: under way at its start, or
    listed later and not at its start; by name, the latest state seen."""
    known = {m.name for m in before}
    out = {m.name: m for m in before if m.live}
    for m in later:
        if m.name not in known or m.name in out:
            out[m.name] = m
    return out


def migration_rows(
    migrations: dict[str, SlotMigration], where: dict[str, str]
) -> list[dict[str, object]]:
    """The report's rows: slots, source and target (host:port where known), state."""
    return [
        {
            "slots": [list(r) for r in m.slots],
            "source": where.get(m.source, m.source),
            "target": where.get(m.target, m.target),
            "state": m.state,
        }
        for m in sorted(migrations.values(), key=lambda m: m.slots)
    ]
