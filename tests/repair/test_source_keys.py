"""A rebuild's source key hashes past their memory share: spilled in sorted runs, and
`lacks` and `repeats` answer as when every hash is held."""

from __future__ import annotations

from replag.repair.bulk.source_keys import LEAST_BYTES, SourceKeys


def names(start: int, stop: int) -> list[bytes]:
    return [b"k:%07d" % i for i in range(start, stop)]


def test_spilled_runs_answer_as_memory_does() -> None:
    held, spilled = SourceKeys(), SourceKeys(memory_bytes=LEAST_BYTES)
    try:
        for start in range(0, 40_000, 1000):
            for keys in (held, spilled):
                keys.add(names(start, start + 1000))
        assert spilled.spilled_bytes >= 8 * 30_000 and held.spilled_bytes == 0
        assert len(spilled) == len(held) == 40_000
        asked = names(39_990, 40_010) + names(5, 7)
        assert spilled.lacks(asked) == held.lacks(asked) == names(40_000, 40_010)
        assert not spilled.repeats() and not held.repeats()
        for keys in (held, spilled):
            keys.add(names(12_345, 12_346))  # SCAN returned a key of an early run again
        assert spilled.repeats() and held.repeats()
    finally:
        spilled.close()
        held.close()
