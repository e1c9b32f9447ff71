"""Writing a repair without losing a write: compare-and-write, lanes per replica, undo
records, rounds that recheck what changed, and the verification after.

Uses `decisions`, `trees` and `keyspace`.
"""
