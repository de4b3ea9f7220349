"""psycopg 3's ``AsyncConnectionPool`` behind the asyncpg-shaped calls the store makes.

The store's SQL numbers its parameters (``$1``, asyncpg's style, a number may repeat);
psycopg takes ``%s`` in order, so each statement is rewritten once, with the order in which
its parameters are read.  Connections must be in autocommit mode: each operation is then
one statement and one round trip, as on asyncpg (a transaction would add ``COMMIT``).
"""

from __future__ import annotations

import re
from typing import Any, Final

from idempotency_async.errors import ConfigError

__all__ = ["PsycopgConnection", "PsycopgPool", "is_psycopg_connection", "is_psycopg_pool"]

_PARAMETER: Final = re.compile(r"\$(\d+)")
# psycopg.pq.TransactionStatus values (not imported: psycopg is optional).
_IDLE: Final = 0
_INTRANS: Final = 2
_INERROR: Final = 3


def is_psycopg_pool(pool: Any) -> bool:
    return type(pool).__module__.startswith("psycopg_pool")


def is_psycopg_connection(connection: Any) -> bool:
    module = type(connection).__module__
    return module == "psycopg" or module.startswith("psycopg.")


class _Positional:
    """The store's ``$n`` statements rewritten for psycopg's ``%s``, once per statement."""

    def __init__(self) -> None:
        self._converted: dict[str, tuple[str, tuple[int, ...]]] = {}

    def __call__(self, sql: str, args: tuple[Any, ...]) -> tuple[str, list[Any]]:
        converted = self._converted.get(sql)
        if converted is None:
            order = tuple(int(number) - 1 for number in _PARAMETER.findall(sql))
            converted = self._converted[sql] = (_PARAMETER.sub("%s", sql), order)
        text, order = converted
        return text, [args[index] for index in order]


_positional = _Positional()


class PsycopgPool:
    """Runs the store's statements on a ``psycopg_pool.AsyncConnectionPool``."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    async def _cursor(self, connection: Any, sql: str, args: tuple[Any, ...]) -> Any:
        if not connection.autocommit:
            raise ConfigError(
                "PostgresStore needs a psycopg pool in autocommit mode: "
                "AsyncConnectionPool(dsn, kwargs={'autocommit': True})"
            )
        text, ordered = _positional(sql, args)
        return await connection.execute(text, ordered)

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        async with self._pool.connection() as connection:
            cursor = await self._cursor(connection, sql, args)
            return await cursor.fetchone()

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        async with self._pool.connection() as connection:
            cursor = await self._cursor(connection, sql, args)
            rows: list[Any] = await cursor.fetchall()
            return rows

    async def execute(self, sql: str, *args: Any) -> None:
        async with self._pool.connection() as connection:
            await self._cursor(connection, sql, args)


class PsycopgConnection:
    """A caller's psycopg ``AsyncConnection`` (a transactional call): its transaction is
    the caller's, so nothing here commits, and every statement runs on that connection."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    def in_transaction(self, *, implicit: bool = False, aborted: bool = False) -> bool:
        """Whether the connection is in a transaction (``implicit``: or will open one with
        its next statement, as a connection out of autocommit does — SQLAlchemy's way;
        ``aborted``: or in one a failed statement aborted)."""
        status = int(self._connection.info.transaction_status)
        return (
            status == _INTRANS
            or (aborted and status == _INERROR)
            or (implicit and status == _IDLE and not self._connection.autocommit)
        )

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        text, ordered = _positional(sql, args)
        cursor = await self._connection.execute(text, ordered)
        return await cursor.fetchone()

    async def script(self, sql: str) -> None:
        # No parameters: one round trip of several statements.
        await self._connection.execute(sql)
