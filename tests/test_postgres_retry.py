"""``retry_transaction``: the whole transaction run again after a serialization failure or
a deadlock, on asyncpg, psycopg 3 and SQLAlchemy sessions, against a real postgres."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _postgres import PostgresServer, fresh_table_name

from idempotency_async import Manager, Options, Wait, errors
from idempotency_async.stores.postgres import PostgresStore, create_table, retry_transaction

pytestmark = pytest.mark.postgres


class Setup:
    def __init__(self, server: PostgresServer, pool: Any, table: str) -> None:
        self.server = server
        self.pool = pool
        self.table = table
        self.manager = Manager(
            PostgresStore(pool, table=table),
            Options(key_prefix="retry", event_key_jmespath="id", wait=Wait(timeout=10)),
        )

    async def effects(self) -> list[str]:
        return [row[0] for row in await self.pool.fetch(f'SELECT id FROM "{self.table}_fx"')]


@pytest.fixture
async def setup(postgres_server: PostgresServer) -> AsyncIterator[Setup]:
    pool = await postgres_server.pool(max_size=6)
    table = fresh_table_name()
    await create_table(pool, table=table)
    await pool.execute(f'CREATE TABLE "{table}_fx" (id text)')
    try:
        yield Setup(postgres_server, pool, table)
    finally:
        await pool.close()


async def _duplicates(setup: Setup, connect: Any, run: Any) -> list[Any]:
    """Two REPEATABLE READ transactions of one key at once: the second's snapshot is taken
    before the first commits, so its first attempt fails (40001) and its retry replays."""
    first_claimed, snapshot_taken = asyncio.Event(), asyncio.Event()
    attempts: list[str] = []

    async def call(name: str, connection: Any) -> Any:
        attempts.append(name)
        await run(connection, "SELECT 1")  # the snapshot
        if name == "second" and not snapshot_taken.is_set():
            snapshot_taken.set()
            await first_claimed.wait()

        async def pay() -> str:
            await run(connection, f"INSERT INTO \"{setup.table}_fx\" VALUES ('{name}')")
            if name == "first":
                first_claimed.set()
                await snapshot_taken.wait()
            return name

        return await setup.manager.execute_in_transaction(connection, {"id": "k"}, pay)

    async def worker(name: str) -> Any:
        async with connect() as connection:
            return await retry_transaction(
                connection,
                lambda c: call(name, c),
                isolation="repeatable_read",
                first_delay=0.01,
            )

    results = await asyncio.gather(worker("first"), worker("second"))
    assert sorted(attempts) == ["first", "second", "second"]  # the second ran twice
    return results


async def test_asyncpg_a_duplicate_under_repeatable_read_is_retried_and_replays(
    setup: Setup,
) -> None:
    async def run(connection: Any, sql: str) -> None:
        await connection.execute(sql)

    assert await _duplicates(setup, setup.pool.acquire, run) == ["first", "first"]
    assert await setup.effects() == ["first"]


async def test_psycopg_too(setup: Setup) -> None:
    psycopg = pytest.importorskip("psycopg")
    dsn = setup.server.dsn.replace("postgres://", "postgresql://")

    def connect() -> Any:
        return _PsycopgConnection(psycopg, dsn)

    async def run(connection: Any, sql: str) -> None:
        await connection.execute(sql)

    assert await _duplicates(setup, connect, run) == ["first", "first"]
    assert await setup.effects() == ["first"]


class _PsycopgConnection:
    """A psycopg connection in autocommit, as an async context manager."""

    def __init__(self, psycopg: Any, dsn: str) -> None:
        self._psycopg, self._dsn = psycopg, dsn

    async def __aenter__(self) -> Any:
        self._connection = await self._psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
        return self._connection

    async def __aexit__(self, *exc: object) -> None:
        await self._connection.close()


async def test_sqlalchemy_sessions_too(setup: Setup) -> None:
    pytest.importorskip("sqlalchemy")
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(setup.server.dsn.replace("postgres://", "postgresql+asyncpg://"))

    def connect() -> Any:
        return AsyncSession(engine)

    async def run(session: Any, sql: str) -> None:
        await session.execute(text(sql))

    try:
        assert await _duplicates(setup, connect, run) == ["first", "first"]
    finally:
        await engine.dispose()
    assert await setup.effects() == ["first"]


async def test_a_failed_commit_is_retried_and_other_errors_are_not(setup: Setup) -> None:
    # Under SERIALIZABLE a COMMIT itself can fail with 40001 (a driver error, not ours):
    # two transactions reading what the other writes.
    await setup.pool.execute(f"INSERT INTO \"{setup.table}_fx\" VALUES ('seed')")
    barrier = asyncio.Barrier(2)
    runs = {"a": 0, "b": 0}

    async def skewed(name: str, connection: Any) -> int:
        runs[name] += 1
        count: int = await connection.fetchval(f'SELECT count(*) FROM "{setup.table}_fx"')
        if runs[name] == 1:
            await barrier.wait()  # both read before either writes, on the first attempt
        await connection.execute(f'INSERT INTO "{setup.table}_fx" VALUES ($1)', name)
        return count

    async def worker(name: str) -> int:
        async with setup.pool.acquire() as connection:
            return await retry_transaction(
                connection, lambda c: skewed(name, c), isolation="serializable", first_delay=0.01
            )

    counts = await asyncio.gather(worker("a"), worker("b"))
    assert sorted(counts) == [1, 2]  # serialized: one saw the other's row
    assert sum(runs.values()) == 3  # one of them ran again
    # Any other error propagates at once; the attempts are bounded.
    calls = 0

    async def broken(connection: Any) -> None:
        nonlocal calls
        calls += 1
        await connection.execute("SELECT 1/0")

    async with setup.pool.acquire() as connection:
        with pytest.raises(Exception, match="division by zero"):
            await retry_transaction(connection, broken)
        assert calls == 1

        async def always(connection: Any) -> None:
            raise errors.SerializationFailureError("again", key="k", sqlstate="40001")

        with pytest.raises(errors.SerializationFailureError):
            await retry_transaction(connection, always, attempts=3, first_delay=0)
        with pytest.raises(errors.ConfigError, match="attempts"):
            await retry_transaction(connection, always, attempts=0)
        with pytest.raises(errors.ConfigError, match="isolation"):
            await retry_transaction(connection, always, isolation="snapshot")  # type: ignore[arg-type]
        with pytest.raises(errors.ConfigError, match="retry_transaction takes"):
            await retry_transaction(setup.pool, always)
