"""What to do about a divergent key: policies by group kind, the decision per key, findings,
outages, replica roles, and the report a check or repair prints.

Uses `trees` and `keyspace`.
"""
