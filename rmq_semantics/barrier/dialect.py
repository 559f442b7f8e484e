"""What differs between the barrier's databases: placeholders, DDL, how a transaction starts
and how long a back-check waits for the barrier row. One module per database; this one holds
the shared SQL they build on (:mod:`.connections` picks one from a connection's type)."""

from __future__ import annotations

import re
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any

from rmq_semantics.errors import ConfigError

__all__ = ["KEY", "AsyncDialect", "Dialect", "validate_table"]

# dtm's barrier key is (gid, branch_id, op, barrier_id); a message transaction has one
# branch and one operation, so only gid (the transaction id) varies.
KEY = ("00", "msg", "01")

_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")


def validate_table(table: object) -> str:
    """A plain or schema-qualified SQL identifier (it is formatted into the SQL, so no
    quoting games)."""
    if not isinstance(table, str) or not _TABLE.fullmatch(table):
        raise ConfigError(
            f"table must be an SQL identifier such as 'rmq_barrier' or "
            f"'myschema.rmq_barrier', got {table!r}"
        )
    return table


class Dialect:
    """The SQL both databases share; subclasses fill in the differences."""

    name = ""
    param = "?"
    created_at_column = ""

    def create_table_sql(self, table: str) -> list[str]:
        schema, _, name = table.rpartition(".")
        index = f"{name}_created_at"
        return [
            f"CREATE TABLE IF NOT EXISTS {table} (gid TEXT NOT NULL, branch_id TEXT NOT NULL, "
            f"op TEXT NOT NULL, barrier_id TEXT NOT NULL, reason TEXT NOT NULL, "
            f"{self.created_at_column}, PRIMARY KEY (gid, branch_id, op, barrier_id))",
            self.index_sql(schema, index, table),
        ]

    def index_sql(self, schema: str, index: str, table: str) -> str:
        raise NotImplementedError

    def insert_ignore_sql(self, table: str) -> str:
        raise NotImplementedError

    def purge_sql(self, table: str) -> str:
        raise NotImplementedError

    def transaction(self, conn: Any, wait_s: float | None = None) -> AbstractContextManager[Any]:
        """A transaction on ``conn`` yielding a cursor: committed when the block ends,
        rolled back when it raises. With ``wait_s`` (a back-check) a lock wait longer than
        that raises RmqTimeoutError."""
        raise NotImplementedError

    def insert_ignore(self, cursor: Any, table: str, gid: str, reason: str) -> bool:
        """Insert the barrier row unless it exists; True when this call inserted it."""
        cursor.execute(self.insert_ignore_sql(table), (gid, *KEY, reason))
        return cursor.rowcount == 1

    def reason_sql(self, table: str) -> str:
        p = self.param
        return (
            f"SELECT reason FROM {table} WHERE gid = {p} AND branch_id = {p} "
            f"AND op = {p} AND barrier_id = {p}"
        )

    def reason(self, cursor: Any, table: str, gid: str) -> str | None:
        cursor.execute(self.reason_sql(table), (gid, *KEY))
        row = cursor.fetchone()
        return None if row is None else row[0]


class AsyncDialect:
    """A dialect's SQL on an asyncio connection (aiosqlite, psycopg's AsyncConnection): the
    same statements, awaited; subclasses give the transaction."""

    def __init__(self, sql: Dialect) -> None:
        self.sql = sql
        self.name = sql.name

    def transaction(
        self, conn: Any, wait_s: float | None = None
    ) -> AbstractAsyncContextManager[Any]:
        """As :meth:`Dialect.transaction`, awaited."""
        raise NotImplementedError

    async def insert_ignore(self, cursor: Any, table: str, gid: str, reason: str) -> bool:
        await cursor.execute(self.sql.insert_ignore_sql(table), (gid, *KEY, reason))
        return cursor.rowcount == 1

    async def reason(self, cursor: Any, table: str, gid: str) -> str | None:
        await cursor.execute(self.sql.reason_sql(table), (gid, *KEY))
        row = await cursor.fetchone()
        return None if row is None else row[0]
