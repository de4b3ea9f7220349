"""Transactional calls (``Manager.execute_in_transaction``) on a real postgres: the claim,
the callback's writes and the completion commit or roll back together in the caller's
transaction; duplicates wait on the row; the drivers asyncpg, psycopg 3 and SQLAlchemy."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _postgres import PostgresServer, fresh_table_name

from idempotency_async import Call, LocalCache, Manager, MemoryStore, Options, Wait, errors
from idempotency_async.stores.postgres import PostgresStore, create_table

pytestmark = pytest.mark.postgres


class Setup:
    def __init__(self, server: PostgresServer, pool: Any, table: str, store: PostgresStore):
        self.server = server
        self.pool = pool
        self.table = table
        self.store = store

    def manager(self, **options: Any) -> Manager:
        options.setdefault("key_prefix", "tx")
        options.setdefault("event_key_jmespath", "id")
        return Manager(self.store, Options(**options))

    async def effects(self, key: str | None = None) -> list[Any]:
        if key is None:
            return [tuple(r) for r in await self.pool.fetch(f"SELECT id, n FROM {self.table}_fx")]
        rows = await self.pool.fetch(f"SELECT n FROM {self.table}_fx WHERE id = $1", key)
        return [row[0] for row in rows]

    async def status(self, manager: Manager, payload: Any) -> str | None:
        key = manager.key_for(payload)
        row = await self.pool.fetchrow(f"SELECT status FROM {self.table} WHERE key = $1", key)
        return None if row is None else str(row[0])


@pytest.fixture
async def setup(postgres_server: PostgresServer) -> AsyncIterator[Setup]:
    pool = await postgres_server.pool(max_size=12)
    table = fresh_table_name()
    await create_table(pool, table=table)
    await pool.execute(f"CREATE TABLE {table}_fx (id text, n int)")
    store = PostgresStore(pool, table=table)
    try:
        yield Setup(postgres_server, pool, table, store)
    finally:
        await pool.close()


def effect(conn: Any, table: str, key: str, n: int) -> Any:
    async def run() -> dict[str, int]:
        await conn.execute(f"INSERT INTO {table}_fx VALUES ($1, $2)", key, n)
        return {"n": n}

    return run


# -- preconditions -------------------------------------------------------------------


async def test_a_connection_outside_a_transaction_is_refused_before_any_statement(
    setup: Setup,
) -> None:
    manager = setup.manager()
    async with setup.pool.acquire() as conn:
        with pytest.raises(errors.ConfigError, match="in a transaction"):
            await manager.execute_in_transaction(
                conn, {"id": "a"}, effect(conn, setup.table, "a", 1)
            )
        with pytest.raises(errors.ConfigError, match="acquire a connection"):
            await manager.execute_in_transaction(
                setup.pool, {"id": "a"}, effect(conn, setup.table, "a", 1)
            )
    assert await setup.effects() == []
    assert await setup.status(manager, {"id": "a"}) is None


async def test_a_manager_on_another_store_is_refused(setup: Setup) -> None:
    manager = Manager(MemoryStore(), Options(event_key_jmespath="id"))
    async with setup.pool.acquire() as conn, conn.transaction():
        with pytest.raises(errors.ConfigError, match="PostgresStore"):
            await manager.execute_in_transaction(
                conn, {"id": "a"}, effect(conn, setup.table, "a", 1)
            )


# -- one call ------------------------------------------------------------------------


async def test_the_record_and_the_effect_commit_together_and_replay(setup: Setup) -> None:
    manager = setup.manager()
    payload = {"id": "order-1"}
    async with setup.pool.acquire() as conn, conn.transaction():
        assert await manager.execute_in_transaction(
            conn, payload, effect(conn, setup.table, "order-1", 1)
        ) == {"n": 1}
        # Inside the transaction, before COMMIT: nobody else sees either.
        assert await setup.status(manager, payload) is None
        assert await setup.effects() == []
    assert await setup.status(manager, payload) == "COMPLETED"
    assert await setup.effects() == [("order-1", 1)]
    async with setup.pool.acquire() as conn, conn.transaction():
        replay = await manager.execute_in_transaction(
            conn, payload, effect(conn, setup.table, "order-1", 2)
        )
    assert replay == {"n": 1}
    assert await setup.effects() == [("order-1", 1)]
    # Lease-mode calls of the same manager replay it too.
    assert await manager.execute(payload, effect(conn, setup.table, "order-1", 3)) == {"n": 1}


async def test_a_rollback_after_the_call_returned_leaves_nothing(setup: Setup) -> None:
    manager = setup.manager(local_cache=LocalCache())
    payload = {"id": "k"}

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        async with setup.pool.acquire() as conn, conn.transaction():
            await manager.execute_in_transaction(conn, payload, effect(conn, setup.table, "k", 1))
            raise Abort
    assert await setup.status(manager, payload) is None
    assert await setup.effects() == []
    # Nothing learned the result before the COMMIT that never came: the next call runs.
    async with setup.pool.acquire() as conn, conn.transaction():
        assert await manager.execute_in_transaction(
            conn, payload, effect(conn, setup.table, "k", 2)
        ) == {"n": 2}
    assert await setup.effects() == [("k", 2)]


async def test_a_failing_callback_rolls_back_only_the_savepoint(setup: Setup) -> None:
    manager = setup.manager()
    payload = {"id": "k"}
    async with setup.pool.acquire() as conn, conn.transaction():
        await conn.execute(f"INSERT INTO {setup.table}_fx VALUES ('before', 0)")

        async def fails() -> None:
            await effect(conn, setup.table, "k", 1)()
            await conn.execute("SELECT 1/0")  # aborts the transaction up to the savepoint

        with pytest.raises(Exception, match="division by zero"):
            await manager.execute_in_transaction(conn, payload, fails)
        # The caller's transaction is usable, with its own earlier write kept.
        await conn.execute(f"INSERT INTO {setup.table}_fx VALUES ('after', 2)")
    assert sorted(await setup.effects()) == [("after", 2), ("before", 0)]
    assert await setup.status(manager, payload) is None


class Counted:
    """A payload value that counts how often the manager serializes it (once per key
    derivation)."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.dumps = 0

    def model_dump(self, mode: str) -> str:
        self.dumps += 1
        return self.value


async def test_a_keyed_payload_derives_its_key_once_for_the_read_and_the_call(
    setup: Setup,
) -> None:
    manager = setup.manager()
    counted = Counted("order-k")
    keyed = manager.keyed({"id": counted})
    async with setup.pool.acquire() as conn, conn.transaction():
        assert await keyed.replay(default=None) is None
        work = effect(conn, setup.table, "order-k", 1)
        assert await keyed.execute_call_in_transaction(conn, lambda call: work()) == {"n": 1}
    assert counted.dumps == 1
    assert keyed.key == manager.key_for({"id": "order-k"})
    assert await keyed.replay(default=None) == {"n": 1}
    assert counted.dumps == 1
    assert await setup.status(manager, {"id": "order-k"}) == "COMPLETED"


async def test_a_keyed_payload_of_a_disabled_manager_runs_unprotected_and_names_its_key(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The HTTP middleware reports a transactional route that never ran its call under this
    # key: it is there even when idempotency is disabled.
    monkeypatch.setenv("POWERTOOLS_IDEMPOTENCY_DISABLED", "true")
    manager = setup.manager()
    keyed = manager.keyed({"id": "d"})
    assert keyed.key is not None and keyed.key == manager.key_for({"id": "d"})
    async with setup.pool.acquire() as conn:
        for n in (1, 2):
            async with conn.transaction():
                assert await keyed.replay(default="nothing") == "nothing"
                work = effect(conn, setup.table, "d", n)
                ran = await keyed.execute_call_in_transaction(conn, lambda call, w=work: w())
                assert ran == {"n": n}
    assert await setup.effects() == [("d", 1), ("d", 2)]
    assert await setup.status(manager, {"id": "d"}) is None


async def test_a_call_released_in_a_transaction_rolls_its_writes_back_and_returns(
    setup: Setup,
) -> None:
    manager = setup.manager()
    payload = {"id": "r"}
    async with setup.pool.acquire() as conn:

        async def fails_softly(call: Call) -> dict[str, int]:
            await effect(conn, setup.table, "r", 1)()
            call.release("a server error is not stored")
            return {"status": 503}

        async with conn.transaction():
            answer = await manager.keyed(payload).execute_call_in_transaction(conn, fails_softly)
        assert answer == {"status": 503}
        assert await setup.effects() == []
        assert await setup.status(manager, payload) is None
        async with conn.transaction():  # the retry runs
            keyed = manager.keyed(payload)
            work = effect(conn, setup.table, "r", 2)
            assert await keyed.execute_call_in_transaction(conn, lambda call: work()) == {"n": 2}
    assert await setup.effects() == [("r", 2)]


async def test_a_cut_off_callback_is_rolled_back(setup: Setup) -> None:
    manager = setup.manager()
    payload = {"id": "slow"}
    async with setup.pool.acquire() as conn, conn.transaction():

        async def slow() -> None:
            await effect(conn, setup.table, "slow", 1)()
            await asyncio.sleep(5)

        with pytest.raises(errors.DeadlineExceededError):
            await manager.execute_in_transaction(conn, payload, slow, timeout=0.3)
        await conn.execute(f"INSERT INTO {setup.table}_fx VALUES ('after', 2)")
    assert await setup.effects() == [("after", 2)]
    assert await setup.status(manager, payload) is None


async def test_the_callers_lock_timeout_is_put_back(setup: Setup) -> None:
    manager = setup.manager(wait=Wait(timeout=3))
    async with setup.pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL lock_timeout = '7s'")
        await manager.execute_in_transaction(conn, {"id": "a"}, effect(conn, setup.table, "a", 1))
        assert await conn.fetchval("SHOW lock_timeout") == "7s"
        await manager.execute_in_transaction(conn, {"id": "a"}, effect(conn, setup.table, "a", 2))
        assert await conn.fetchval("SHOW lock_timeout") == "7s"


# -- duplicates ----------------------------------------------------------------------


async def _hold(setup: Setup, manager: Manager, payload: Any, n: int) -> tuple[Any, Any, Any]:
    """A transaction that has claimed ``payload``'s key and run its callback, left open."""
    conn = await setup.pool.acquire()
    tx = conn.transaction()
    await tx.start()
    result = await manager.execute_in_transaction(
        conn, payload, effect(conn, setup.table, payload["id"], n)
    )
    return conn, tx, result


async def test_a_duplicate_waits_for_the_commit_and_replays(setup: Setup) -> None:
    manager = setup.manager(wait=Wait(timeout=10))
    payload = {"id": "k"}
    conn, tx, _ = await _hold(setup, manager, payload, 1)
    try:
        calls = 0

        async def duplicate() -> Any:
            async with setup.pool.acquire() as other, other.transaction():

                async def run() -> Any:
                    nonlocal calls
                    calls += 1
                    return await effect(other, setup.table, "k", 2)()

                return await manager.execute_in_transaction(other, payload, run)

        waiter = asyncio.create_task(duplicate())
        await asyncio.sleep(0.3)
        assert not waiter.done()  # blocked on the row
        await tx.commit()
        assert await asyncio.wait_for(waiter, 5) == {"n": 1}
        assert calls == 0
    finally:
        await setup.pool.release(conn)
    assert await setup.effects() == [("k", 1)]


async def test_a_duplicate_runs_when_the_holder_rolls_back(setup: Setup) -> None:
    manager = setup.manager(wait=Wait(timeout=10))
    payload = {"id": "k"}
    conn, tx, _ = await _hold(setup, manager, payload, 1)
    try:

        async def duplicate() -> Any:
            async with setup.pool.acquire() as other, other.transaction():
                return await manager.execute_in_transaction(
                    other, payload, effect(other, setup.table, "k", 2)
                )

        waiter = asyncio.create_task(duplicate())
        await asyncio.sleep(0.3)
        assert not waiter.done()
        await tx.rollback()
        assert await asyncio.wait_for(waiter, 5) == {"n": 2}
    finally:
        await setup.pool.release(conn)
    assert await setup.effects() == [("k", 2)]
    assert await setup.status(manager, payload) == "COMPLETED"


@pytest.mark.parametrize("wait", [False, True])
async def test_a_lock_wait_is_bounded_and_keeps_the_callers_transaction(
    setup: Setup, wait: bool
) -> None:
    manager = setup.manager(wait=Wait(timeout=0.4) if wait else None)
    payload = {"id": "k"}
    conn, tx, _ = await _hold(setup, manager, payload, 1)
    try:
        async with setup.pool.acquire() as other, other.transaction():
            await other.execute(f"INSERT INTO {setup.table}_fx VALUES ('mine', 0)")
            started = time.monotonic()
            with pytest.raises(errors.LockTimeoutError) as caught:
                await manager.execute_in_transaction(
                    other, payload, effect(other, setup.table, "k", 2)
                )
            waited = time.monotonic() - started
            assert isinstance(caught.value, errors.AlreadyInProgressError)
            assert waited >= 0.35 if wait else waited < 0.35
            assert await other.fetchval("SHOW lock_timeout") == "0"
        await tx.commit()
    finally:
        await setup.pool.release(conn)
    assert sorted(await setup.effects()) == [("k", 1), ("mine", 0)]


async def test_repeatable_read_gets_a_serialization_failure(setup: Setup) -> None:
    manager = setup.manager(wait=Wait(timeout=5))
    payload = {"id": "k"}
    async with setup.pool.acquire() as other, other.transaction(isolation="repeatable_read"):
        await other.fetchval("SELECT 1")  # the snapshot is taken here
        async with setup.pool.acquire() as conn, conn.transaction():
            await manager.execute_in_transaction(conn, payload, effect(conn, setup.table, "k", 1))
        with pytest.raises(errors.SerializationFailureError) as caught:
            await manager.execute_in_transaction(other, payload, effect(other, setup.table, "k", 2))
        assert isinstance(caught.value, errors.TransactionRetryError)
        assert caught.value.sqlstate == "40001"
    assert await setup.effects() == [("k", 1)]


async def test_a_deadlock_is_a_typed_error(setup: Setup) -> None:
    manager = setup.manager(wait=Wait(timeout=10))
    first, tx1, _ = await _hold(setup, manager, {"id": "a"}, 1)
    second, tx2, _ = await _hold(setup, manager, {"id": "b"}, 2)
    try:
        tasks = {
            asyncio.create_task(
                manager.execute_in_transaction(
                    first, {"id": "b"}, effect(first, setup.table, "b", 3)
                )
            ): tx1,
            asyncio.create_task(
                manager.execute_in_transaction(
                    second, {"id": "a"}, effect(second, setup.table, "a", 4)
                )
            ): tx2,
        }
        done, pending = await asyncio.wait(tasks, timeout=8, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1 and len(pending) == 1
        failed = done.pop()
        assert isinstance(failed.exception(), errors.DeadlockDetectedError), failed
        # PostgreSQL failed one claim; once its transaction rolls back, the other one runs.
        await tasks[failed].rollback()
        survivor = pending.pop()
        assert (await asyncio.wait_for(survivor, 5))["n"] in (3, 4)
        await tasks[survivor].commit()
    finally:
        for tx in (tx1, tx2):
            with contextlib.suppress(Exception):
                await tx.rollback()
        await setup.pool.release(first)
        await setup.pool.release(second)
    assert len(await setup.effects()) == 2  # the survivor's first key and the key it took


# -- other drivers -------------------------------------------------------------------


async def test_psycopg_connections(setup: Setup) -> None:
    psycopg = pytest.importorskip("psycopg")
    manager = setup.manager()
    dsn = setup.server.dsn.replace("postgres://", "postgresql://")
    async with await psycopg.AsyncConnection.connect(dsn) as conn:

        def write(n: int) -> Any:
            async def run() -> dict[str, int]:
                await conn.execute(f"INSERT INTO {setup.table}_fx VALUES (%s, %s)", ("p", n))
                return {"n": n}

            return run

        await conn.set_autocommit(True)
        with pytest.raises(errors.ConfigError, match="in a transaction"):
            await manager.execute_in_transaction(conn, {"id": "p"}, write(0))
        async with conn.transaction():
            assert await manager.execute_in_transaction(conn, {"id": "p"}, write(1)) == {"n": 1}
        async with conn.transaction():
            assert await manager.execute_in_transaction(conn, {"id": "p"}, write(2)) == {"n": 1}
    assert await setup.effects() == [("p", 1)]


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_sqlalchemy_sessions_and_connections(setup: Setup, driver: str) -> None:
    pytest.importorskip("sqlalchemy")
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    manager = setup.manager()
    url = setup.server.dsn.replace("postgres://", f"postgresql+{driver}://")
    engine = create_async_engine(url)
    insert = text(f"INSERT INTO {setup.table}_fx VALUES (:id, :n)")
    try:
        async with AsyncSession(engine) as session:
            with pytest.raises(errors.ConfigError, match="in a transaction"):
                await manager.execute_in_transaction(session, {"id": "s"}, lambda: asyncio.sleep(0))
            async with session.begin():

                async def first() -> dict[str, int]:
                    await session.execute(insert, {"id": "s", "n": 1})
                    return {"n": 1}

                assert await manager.execute_in_transaction(session, {"id": "s"}, first) == {"n": 1}
                assert await setup.effects() == []  # not committed yet
        async with engine.connect() as connection, connection.begin():

            async def second() -> dict[str, int]:
                await connection.execute(insert, {"id": "s", "n": 2})
                return {"n": 2}

            assert await manager.execute_in_transaction(connection, {"id": "s"}, second) == {"n": 1}
            await manager.execute_in_transaction(connection, {"id": "t"}, second)
            await connection.rollback()
    finally:
        await engine.dispose()
    assert await setup.effects() == [("s", 1)]


# -- cutoffs and cancellation ----------------------------------------------------------


async def test_a_cutoff_during_a_statement_rolls_back_and_keeps_the_connection(
    setup: Setup,
) -> None:
    manager = setup.manager()
    async with setup.pool.acquire() as conn, conn.transaction():

        async def stuck() -> None:
            await effect(conn, setup.table, "s", 1)()
            await conn.execute("SELECT pg_sleep(5)")

        started = time.monotonic()
        with pytest.raises(errors.DeadlineExceededError):
            await manager.execute_in_transaction(conn, {"id": "s"}, stuck, timeout=0.4)
        assert time.monotonic() - started < 3
        await conn.execute(f"INSERT INTO {setup.table}_fx VALUES ('after', 2)")
    assert await setup.effects() == [("after", 2)]
    assert await setup.status(manager, {"id": "s"}) is None


async def test_the_callers_cancellation_sends_no_statement(setup: Setup) -> None:
    manager = setup.manager()
    started = asyncio.Event()
    async with setup.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()

        async def long() -> None:
            await effect(conn, setup.table, "c", 1)()
            started.set()
            await asyncio.sleep(5)

        call = asyncio.create_task(manager.execute_in_transaction(conn, {"id": "c"}, long))
        await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # No ROLLBACK TO SAVEPOINT went out: the callback's row and the claim are still
        # there, in the transaction the caller now rolls back.
        assert await conn.fetchval(f"SELECT count(*) FROM {setup.table}_fx") == 1
        assert await conn.fetchval(f"SELECT count(*) FROM {setup.table}") == 1
        await tx.rollback()
    assert await setup.effects() == []
    assert await setup.status(manager, {"id": "c"}) is None


async def test_a_cutoff_during_a_psycopg_statement_rolls_back(setup: Setup) -> None:
    psycopg = pytest.importorskip("psycopg")
    manager = setup.manager()
    dsn = setup.server.dsn.replace("postgres://", "postgresql://")
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():

        async def stuck() -> None:
            await conn.execute(f"INSERT INTO {setup.table}_fx VALUES ('s', 1)")
            await conn.execute("SELECT pg_sleep(5)")

        started = time.monotonic()
        with pytest.raises(errors.DeadlineExceededError):
            await manager.execute_in_transaction(conn, {"id": "s"}, stuck, timeout=0.4)
        assert time.monotonic() - started < 3
        await conn.execute(f"INSERT INTO {setup.table}_fx VALUES ('after', 2)")
    assert await setup.effects() == [("after", 2)]


async def test_transactional_calls_through_pgbouncer_in_transaction_mode(
    setup: Setup, pgbouncer: Any
) -> None:
    import asyncpg

    manager = setup.manager(wait=Wait(timeout=5))
    calls = 0

    async def one(n: int) -> Any:
        conn = await asyncpg.connect(pgbouncer.dsn, statement_cache_size=0)
        try:
            async with conn.transaction():

                async def run() -> dict[str, int]:
                    nonlocal calls
                    calls += 1
                    return await effect(conn, setup.table, "b", n)()

                return await manager.execute_in_transaction(conn, {"id": "b"}, run)
        finally:
            await conn.close()

    results = await asyncio.gather(*(one(n) for n in range(8)))
    assert calls == 1
    assert len({r["n"] for r in results}) == 1
    assert len(await setup.effects()) == 1


async def test_transactional_calls_are_observed(setup: Setup) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from idempotency_async.otel import Telemetry

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    manager = setup.manager(telemetry=Telemetry(tracer_provider=provider))
    try:
        for n in (1, 2):
            async with setup.pool.acquire() as conn, conn.transaction():
                await manager.execute_in_transaction(
                    conn, {"id": "o"}, effect(conn, setup.table, "o", n)
                )
        outcomes = [
            (span.attributes or {}).get("idempotency.outcome")
            for span in spans.get_finished_spans()
            if span.name.startswith("idempotency")
        ]
        assert outcomes == ["claimed", "replayed"]
    finally:
        provider.shutdown()
    assert await setup.effects() == [("o", 1)]


async def test_a_released_transactional_call_is_observed_as_claimed_not_failed(
    setup: Setup,
) -> None:
    # The HTTP middleware releases a transactional route's 5xx this way: the call's span
    # is no failure (it once ended with a private exception's error.type).
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from idempotency_async.otel import Telemetry

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    manager = setup.manager(telemetry=Telemetry(tracer_provider=provider))

    async def answers_503(call: Call) -> int:
        call.release("a server error is not stored")
        return 503

    try:
        async with setup.pool.acquire() as conn, conn.transaction():
            keyed = manager.keyed({"id": "o"})
            assert await keyed.execute_call_in_transaction(conn, answers_503) == 503
        [span] = [s for s in spans.get_finished_spans() if s.name.startswith("idempotency")]
        attributes = span.attributes or {}
        assert attributes.get("idempotency.outcome") == "claimed"
        assert "error.type" not in attributes
    finally:
        provider.shutdown()
    assert await setup.status(manager, {"id": "o"}) is None


# -- lease-mode calls meeting a transactional call ---------------------------------------


async def test_a_lease_mode_claim_waits_for_an_open_transaction_at_most_its_deadline(
    setup: Setup,
) -> None:
    manager = setup.manager()
    conn, tx, _ = await _hold(setup, manager, {"id": "m"}, 1)
    try:
        started = time.monotonic()
        with pytest.raises(errors.LockTimeoutError):
            await manager.execute({"id": "m"}, effect(setup.pool, setup.table, "m", 2), timeout=0.5)
        assert time.monotonic() - started < 1.5  # not until the transaction ends
        # Once the transaction commits, a lease-mode duplicate replays it.
        await tx.commit()
        assert await manager.execute(
            {"id": "m"}, effect(setup.pool, setup.table, "m", 3), timeout=5
        ) == {"n": 1}
    finally:
        await setup.pool.release(conn)
    assert await setup.effects() == [("m", 1)]


@pytest.mark.parametrize("flush", [False, True])
async def test_a_failed_orm_callback_leaves_nothing_in_the_session(
    setup: Setup, flush: bool
) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.orm import DeclarativeBase

    class Base(DeclarativeBase):
        pass

    class Effect(Base):
        __tablename__ = f"{setup.table}_fx"
        id = sqlalchemy.Column(sqlalchemy.Text, primary_key=True)
        n = sqlalchemy.Column(sqlalchemy.Integer)

    engine = create_async_engine(setup.server.dsn.replace("postgres://", "postgresql+asyncpg://"))
    manager = setup.manager()
    try:
        async with AsyncSession(engine) as session, session.begin():
            session.add(Effect(id="caller's", n=0))  # the caller's own, unflushed
            with pytest.raises(errors.ConfigError, match="flush"):
                await manager.execute_in_transaction(session, {"id": "o"}, lambda: 0)
            await session.flush()

            async def fails() -> None:
                session.add(Effect(id="o", n=1))
                if flush:
                    await session.flush()
                raise RuntimeError("payment declined")

            with pytest.raises(RuntimeError):
                await manager.execute_in_transaction(session, {"id": "o"}, fails)
            # The caller goes on and commits: what the callback did must not come along.
        async with AsyncSession(engine) as session, session.begin():

            async def succeeds() -> int:
                session.add(Effect(id="o", n=2))
                return 2

            assert await manager.execute_in_transaction(session, {"id": "o"}, succeeds) == 2
    finally:
        await engine.dispose()
    assert sorted(await setup.effects()) == [("caller's", 0), ("o", 2)]


async def test_an_operators_release_of_a_key_an_open_transaction_holds_is_bounded(
    setup: Setup,
) -> None:
    manager = setup.manager()
    # An expired record the transactional call claims over: its committed row is locked
    # (a row the transaction inserted is invisible to others, and deleted as nothing).
    await setup.pool.execute(
        f"INSERT INTO {setup.table} (key, status, owner, expires_at) "
        "VALUES ($1, 'COMPLETED', 'old', now() - interval '1 hour')",
        manager.key_for({"id": "r"}),
    )
    conn, tx, _ = await _hold(setup, manager, {"id": "r"}, 1)
    try:
        started = time.monotonic()
        with pytest.raises(errors.StoreUnavailableError, match="open transaction"):
            await manager.force_release(manager.key_for({"id": "r"}) or "")
        assert time.monotonic() - started < 4
        await tx.commit()
    finally:
        await setup.pool.release(conn)
    assert await manager.force_release(manager.key_for({"id": "r"}) or "") is not None
