"""Open defects of transactional calls found by the proof, each a failing reproduction
marked ``xfail(strict=True)``: when the core is fixed the test passes, strict xfail
fails, and the marker comes off."""

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


@pytest.mark.xfail(
    strict=True,
    reason="core defect: PostgresStore's lease-mode claim has no lock bound, so a lease-mode "
    "call meeting a key's row held by an open transactional call blocks until that "
    "transaction ends, whatever its wait=False and timeout",
)
async def test_a_lease_mode_call_meeting_a_row_an_open_transaction_holds_keeps_its_bounds(
    postgres_server: PostgresServer,
) -> None:
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
        # wait=False: refused at once; at the latest, its own 0.5 s timeout.  (Today it
        # waits for the holder's COMMIT, then replays.)
        assert waited < 1.5, f"the lease-mode call waited {waited:.2f} s, then got {got!r}"
    finally:
        await pool.close()


@pytest.mark.xfail(
    strict=True,
    reason="core defect: on an AsyncSession, the callback's un-flushed ORM changes are not in "
    "the library's savepoint; after the callback raises, ROLLBACK TO SAVEPOINT leaves them "
    "pending, and a caller that commits (its transaction is documented as still usable) "
    "commits the effect without a record, so the key runs and commits again",
)
async def test_an_orm_callback_s_unflushed_effect_is_undone_with_its_savepoint(
    postgres_server: PostgresServer,
) -> None:
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


@pytest.mark.xfail(
    strict=True,
    reason="core defect: a serialization failure (40001) at the completion surfaces as "
    "CompletionError ('outcome unknown … may stay in progress until its lease ends'), not "
    "as a TransactionRetryError, though the transaction is aborted and nothing of the call "
    "can commit: a caller retrying on TransactionRetryError does not retry it",
)
async def test_a_serialization_failure_at_the_completion_is_a_transaction_retry_error(
    postgres_server: PostgresServer,
) -> None:
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
