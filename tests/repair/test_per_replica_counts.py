"""The per-replica table's counts: a key the replicas agree on by the time the repair came
to it (clients overwrote it meanwhile, as during a resumed run's pause) was found, but it
is not left: the table's `left` says what the summary and `repair runs` say."""

from __future__ import annotations

from replag.repair.decisions import report as rp
from replag.repair.decisions.findings import per_replica


def test_agreed_keys_are_found_but_not_left() -> None:
    records = [
        (rp.AGREED, {"findings": {"n2": "missing"}}),  # overwritten meanwhile: agrees now
        (rp.AGREED, {"findings": {"n2": "different"}}),
        (rp.REPAIRED, {"findings": {"n2": "missing"}, "plan": {"n2": "copy"}}),
        (rp.CONFLICT, {"findings": {"n2": "different"}}),
    ]
    counts = per_replica(["n0", "n1", "n2"], records)["n2"]
    assert (counts["missing"], counts["different"]) == (2, 2)  # what was found
    assert (counts["copy"], counts["delete"], counts["leave"]) == (1, 0, 1)  # the conflict
    left = sum(1 for status, _ in records if status in rp.LEFT)
    assert counts["leave"] == left  # the summary's count
