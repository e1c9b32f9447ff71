"""Tictac (XOR Merkle) trees: the tree, the per-key index a scan builds beside it, the walk
that narrows two trees to their differing keys, the diff, and the agents' trees over HTTP.

Uses `keyspace` only.
"""
