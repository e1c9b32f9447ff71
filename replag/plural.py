"""A count and its noun as people write them: "1 key", "2 keys", "1 primary", "3 primaries".

Every human line that counts something goes through `count` (never "1 regions", nor
a parenthesised plural); JSON carries the numbers alone.
"""

from __future__ import annotations

# Nouns whose plural is not noun + "s".
_IRREGULAR = {"primary": "primaries", "delivery": "deliveries", "entry": "entries"}


def plural(noun: str, n: int) -> str:
    """`noun` for `n` of it; the last word takes the plural ("replica group" → groups)."""
    if n == 1:
        return noun
    head, _, last = noun.rpartition(" ")
    many = _IRREGULAR.get(last) or (last + "es" if last.endswith(("s", "sh", "ch")) else last + "s")
    return f"{head} {many}" if head else many


def count(n: int, noun: str, *, fmt: str = "") -> str:
    """`n` and `noun` in the right number: count(1, "key") == "1 key"; `fmt` formats the
    number (",": 1,204)."""
    return f"{n:{fmt}} {plural(noun, n)}"
