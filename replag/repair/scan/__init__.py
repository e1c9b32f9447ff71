"""Reading replicas in full: the SCAN reader (async and blocking), the scan processes that
build trees and indexes in parallel, Redis Cluster slot by slot, and how TTLs are read.

Uses `trees` and `keyspace`.
"""
