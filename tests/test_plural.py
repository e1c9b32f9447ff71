"""Human lines count in words people write: "1 key", "2 keys", never "1 regions" or
"key(s)"; and no product line goes back to "(s)" (a test reads the source)."""

from __future__ import annotations

import re
from pathlib import Path

from replag.plural import count, plural

ROOT = Path(__file__).resolve().parent.parent


def test_counts_take_the_right_number() -> None:
    assert [count(n, "key") for n in (0, 1, 2)] == ["0 keys", "1 key", "2 keys"]
    assert count(1, "primary") == "1 primary" and count(3, "primary") == "3 primaries"
    assert count(2, "replica group") == "2 replica groups"
    assert count(2, "full resync") == "2 full resyncs"
    assert count(1204, "divergent key", fmt=",") == "1,204 divergent keys"
    assert plural("delivery", 2) == "deliveries" and plural("region", 1) == "region"


def test_no_human_line_counts_with_a_parenthesised_s() -> None:
    found = []
    for path in (ROOT / "replag").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"[a-z]\(s\)[^\w]", code) and re.search(r"[\"'][^\"']*\(s\)", code):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == [], "\n".join(found)
