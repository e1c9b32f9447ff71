"""Refilling a replica in bulk: the copy, reading a value from its peers, the refill of a
key set, and the rebuild's checkpoint log.

Uses `writes`, `decisions`, `scan`, `trees` and `keyspace`.
"""
