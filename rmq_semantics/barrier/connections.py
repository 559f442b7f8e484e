"""Which of the barrier's databases a connection belongs to: its dialect, from the
connection's type (sqlite3, aiosqlite, psycopg 3). Above the dialect modules, which build on
:mod:`.dialect`; PostgreSQL's is imported only for a psycopg connection (psycopg is an
optional dependency)."""

from __future__ import annotations

import sqlite3

from rmq_semantics.barrier.dialect import AsyncDialect, Dialect
from rmq_semantics.barrier.sqlite import ASYNC_SQLITE, SQLITE
from rmq_semantics.errors import ConfigError

__all__ = ["async_dialect_of", "dialect_of"]


def _from(conn: object, package: str) -> bool:
    return any(cls.__module__.split(".")[0] == package for cls in type(conn).__mro__)


def async_dialect_of(conn: object) -> AsyncDialect:
    """The dialect of an asyncio connection: aiosqlite's, or psycopg 3's AsyncConnection."""
    if _from(conn, "aiosqlite"):
        return ASYNC_SQLITE
    if _from(conn, "psycopg") and any(c.__name__ == "AsyncConnection" for c in type(conn).__mro__):
        from rmq_semantics.barrier.postgres import ASYNC_POSTGRES

        return ASYNC_POSTGRES
    raise ConfigError(
        f"the async barrier needs an aiosqlite or psycopg (3) AsyncConnection, "
        f"got {type(conn).__module__}.{type(conn).__name__}"
    )


def dialect_of(conn: object) -> Dialect:
    """The dialect of a DB-API connection: sqlite3's, or psycopg 3's."""
    if isinstance(conn, sqlite3.Connection):
        return SQLITE
    if _from(conn, "psycopg") and not any(
        c.__name__ == "AsyncConnection" for c in type(conn).__mro__
    ):
        from rmq_semantics.barrier.postgres import POSTGRES

        return POSTGRES
    raise ConfigError(
        f"the barrier needs a sqlite3 or psycopg (3) connection, got "
        f"{type(conn).__module__}.{type(conn).__name__} (an asyncio "
        f"connection goes to AsyncTransactionBarrier)"
    )
