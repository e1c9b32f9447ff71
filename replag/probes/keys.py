"""Probe key names and values.

Key:   <prefix><run_id>:<seq>          or, for a Redis Cluster shard,
       <prefix><run_id>:{<tag>}:<seq>  with a hash tag whose slot the shard owns.
Value: <utc_epoch_ns>|<source>|<run_id>|<seq>, at most settings.max_probe_value_bytes
       (`ProbeKeys.longest_value`: a region's name must leave room), which bounds what a
       replica may answer a poll's MGET of them with (`replag.wire.reply_bounds`).
"""

from __future__ import annotations

from collections.abc import Sequence


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_TABLE = _crc16_table()


def key_slot(key: bytes) -> int:
    """Redis Cluster hash slot of `key` (CRC16/XMODEM of the hash tag, mod 16384)."""
    start = key.find(b"{")
    if start != -1:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    crc = 0
    for byte in key:
        crc = ((crc << 8) & 0xFFFF) ^ _TABLE[((crc >> 8) ^ byte) & 0xFF]
    return crc % 16384


def hash_tag_for(slots: Sequence[tuple[int, int]]) -> str:
    """The first tag `t<n>` whose slot lies in one of `slots` (inclusive ranges)."""
    for n in range(1_000_000):
        tag = f"t{n}"
        slot = key_slot(tag.encode())
        if any(lo <= slot <= hi for lo, hi in slots):
            return tag
    raise ValueError(f"no hash tag found for slot ranges {list(slots)}")


class ProbeKeys:
    """Names and values of one run's probe keys."""

    def __init__(
        self, *, prefix: str, run_id: str, source: str, slots: Sequence[tuple[int, int]] = ()
    ) -> None:
        self.prefix, self.run_id, self.source = prefix, run_id, source
        tag = f"{{{hash_tag_for(slots)}}}:" if slots else ""
        self._stem = f"{prefix}{run_id}:{tag}".encode()

    @property
    def stem(self) -> bytes:
        """Every key of this run is the stem followed by its sequence number."""
        return self._stem

    @property
    def pattern(self) -> bytes:
        """Glob matching every key of this run (prefixes are validated glob-free)."""
        return f"{self.prefix}{self.run_id}:*".encode()

    def key(self, seq: int) -> bytes:
        return self._stem + str(seq).encode()

    def longest_value(self, count: int) -> int:
        """The most bytes a value of this run's `count` keys holds (a 20-digit timestamp)."""
        return len(self.value(max(0, count - 1), 10**19))

    def value(self, seq: int, wall_ns: int) -> bytes:
        return f"{wall_ns}|{self.source}|{self.run_id}|{seq}".encode()

    @staticmethod
    def parse_value(value: bytes) -> tuple[int, str, str, int]:
        wall, source, run_id, seq = value.decode().split("|")
        return int(wall), source, run_id, int(seq)
