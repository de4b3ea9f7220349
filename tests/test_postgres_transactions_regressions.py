"""Regression tests for the defects of transactional calls that the proof found (each
was a strict-xfail reproduction until the core was fixed)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from _postgres import PostgresServer, fresh_table_name

from idempotency_async import Manager, Options, errors
from idempotency_async.stores.postgres import PostgresStore, create_table

pytestmark = pytest.mark.postgres


async def _table(server: PostgresServer) -> str:
    table = fresh_table_name()
    await create_table(server.dsn, table=table)
    return table


async def test_a_lease_mode_call_meeting_a_row_an_open_transaction_holds_keeps_its_bounds(
    postgres_server: PostgresServer,
) -> None:
    # Found: the lease-mode claim waited on the row lock until the transaction ended.
    table = await _table(postgres_server)
    pool = await postgres_server.pool()
    try:
        manager = Manager(PostgresStore(pool, table=table), Options(key_prefix="mixed"))
        held = asyncio.Event()
        release = asyncio.Event()

        async def hold() -> str:
            async with pool.acquire() as connection, connection.transaction():

                async def callback() -> str:
                    held.set()
                    await release.wait()
                    return "transactional"

                result: str = await manager.execute_in_transaction(
                    connection, {"id": 1}, callback, timeout=30
                )
                return result

        async def lease_mode() -> str:
            return "lease mode"

        holder = asyncio.create_task(hold())
        # The holder ends on its own after 2 s, so a blocked claim cannot hang the test.
        asyncio.get_running_loop().call_later(2.0, release.set)
        try:
            await asyncio.wait_for(held.wait(), timeout=10)
            started = time.monotonic()
            try:
                got = await manager.execute({"id": 1}, lease_mode, timeout=0.5)
            except (errors.AlreadyInProgressError, errors.DeadlineExceededError) as exc:
                got = type(exc).__name__
            waited = time.monotonic() - started
        finally:
            release.set()
            assert await holder == "transactional"
        # Not until the holder's COMMIT: at the latest, when its own 0.5 s lease ends.
        assert waited < 1.5, f"the lease-mode call waited {waited:.2f} s, then got {got!r}"
    finally:
        await pool.close()


async def test_an_orm_callback_s_unflushed_effect_is_undone_with_its_savepoint(
    postgres_server: PostgresServer,
) -> None:
    # Found: the callback's un-flushed ORM objects outlived the savepoint's rollback and
    # committed with the caller's transaction, so the key ran and committed again.
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.orm import DeclarativeBase

    class Base(DeclarativeBase):
        pass

    effects = f"{fresh_table_name()}_fx"

    class Effect(Base):
        __tablename__ = effects
        id = sqlalchemy.Column(sqlalchemy.Integer, primary_key=True, autoincrement=True)
        run = sqlalchemy.Column(sqlalchemy.String)

    table = await _table(postgres_server)
    pool = await postgres_server.pool()
    engine = create_async_engine(
        postgres_server.dsn.replace("postgres://", "postgresql+asyncpg://")
    )
    try:
        manager = Manager(PostgresStore(pool, table=table), Options(key_prefix="orm"))
        async with engine.begin() as connection:
            await connection.run_sync(Base.metadata.create_all)

        def effect(session: Any, run: str, fail: bool) -> Any:
            async def callback() -> str:
                session.add(Effect(run=run))  # the ORM writes at the next flush
                if fail:
                    raise RuntimeError(run)
                return run

            return callback

        async with AsyncSession(engine) as session, session.begin():
            with pytest.raises(RuntimeError):
                await manager.execute_in_transaction(
                    session, {"id": 1}, effect(session, "first", fail=True)
                )
            # Only the library's savepoint was rolled back: the caller commits its own work.
        async with AsyncSession(engine) as session, session.begin():
            assert await manager.execute_in_transaction(
                session, {"id": 1}, effect(session, "second", fail=False)
            ) == ("second")
        async with engine.connect() as connection:
            runs = (await connection.execute(sqlalchemy.select(Effect.run))).scalars().all()
        assert runs == ["second"], f"committed effects of one key: {runs}"
    finally:
        await engine.dispose()
        await pool.close()


async def test_a_serialization_failure_at_the_completion_is_a_transaction_retry_error(
    postgres_server: PostgresServer,
) -> None:
    # Found: it surfaced as CompletionError ("outcome unknown"), which a caller retrying on
    # TransactionRetryError does not retry, though nothing of the call can commit.
    # Write skew between two SERIALIZABLE calls: each callback reads the other's record,
    # the second one commits first, and the first one's completion is the pivot's write.
    table = await _table(postgres_server)
    pool = await postgres_server.pool()
    try:
        manager = Manager(PostgresStore(pool, table=table), Options(key_prefix="ssi"))
        other_key = {"a": manager.key_for({"id": "b"}), "b": manager.key_for({"id": "a"})}
        first, second = await pool.acquire(), await pool.acquire()
        try:
            pivot = first.transaction(isolation="serializable")
            await pivot.start()
            async with second.transaction(isolation="serializable"):
                read = asyncio.Event()
                committed = asyncio.Event()

                def callback(connection: Any, name: str, wait: bool) -> Any:
                    async def work() -> str:
                        await connection.fetch(
                            f'SELECT 1 FROM "{table}" WHERE key = $1', other_key[name]
                        )
                        if wait:
                            read.set()
                            await committed.wait()
                        return name

                    return work

                call = asyncio.create_task(
                    manager.execute_in_transaction(first, {"id": "a"}, callback(first, "a", True))
                )
                await asyncio.wait_for(read.wait(), timeout=10)
                assert await manager.execute_in_transaction(
                    second, {"id": "b"}, callback(second, "b", False)
                ) == ("b")
            committed.set()  # the second transaction committed first
            try:
                with pytest.raises(errors.TransactionRetryError):
                    await asyncio.wait_for(call, timeout=10)
            finally:
                await pivot.rollback()
        finally:
            await pool.release(first)
            await pool.release(second)
    finally:
        await pool.close()
