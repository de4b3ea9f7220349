"""Transactional calls held to their word when the caller, a second engine, a migration or a
lease-mode neighbour does something around them (issue 33), on a real postgres — each test
failed on the code before it:

1. a caller that commits an unfinished claim (after a handled timeout; a callback that
   commits, or leaves a savepoint of the library's old name) has its COMMIT refused; a
   row committed that way anyway (the guard disabled) frees its key at once;
2. a SQLAlchemy session bound to several engines (or none) is ``ConfigError``;
3. a lease-mode duplicate with ``wait=None`` does not wait for an open transactional call;
4. a migration's table lock does not outlive ``timeout=`` (claims and ``Manager.replay``);
5. rows are read back bounded (a 20 MB response, reason, owner or validation column);
6. a caller's ``statement_timeout`` during the claim's lock wait is ``LockTimeoutError``;
   REPEATABLE READ meeting a lease-mode holder is ``SerializationFailureError`` at once;
   a malformed DSN is ``ConfigError``.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _postgres import PostgresServer, fresh_table_name

from idempotency_async import Manager, Options, Wait, errors
from idempotency_async.stores.postgres import PostgresStore, create_table

pytestmark = pytest.mark.postgres

_REFUSED = "IA001"  # the guard's SQLSTATE (the module's REFUSED_COMMIT)


class Setup:
    def __init__(self, server: PostgresServer, pool: Any, table: str) -> None:
        self.server = server
        self.pool = pool
        self.table = table
        self.store = PostgresStore(pool, table=table)

    def manager(self, **options: Any) -> Manager:
        options.setdefault("key_prefix", "misuse")
        options.setdefault("event_key_jmespath", "id")
        return Manager(self.store, Options(**options))

    async def effects(self) -> list[str]:
        return [row[0] for row in await self.pool.fetch(f'SELECT id FROM "{self.table}_fx"')]

    async def row(self, manager: Manager, payload: Any) -> Any:
        sql = f'SELECT status, owner FROM "{self.table}" WHERE key = $1'
        return await self.pool.fetchrow(sql, manager.key_for(payload))

    def effect(self, conn: Any, name: str) -> Any:
        async def run() -> str:
            await conn.execute(f'INSERT INTO "{self.table}_fx" VALUES ($1)', name)
            return name

        return run


@pytest.fixture
async def setup(postgres_server: PostgresServer) -> AsyncIterator[Setup]:
    pool = await postgres_server.pool(max_size=8)
    table = fresh_table_name()
    await create_table(pool, table=table)
    await pool.execute(f'CREATE TABLE "{table}_fx" (id text)')
    try:
        yield Setup(postgres_server, pool, table)
    finally:
        await pool.close()


def _sqlstate(exc: BaseException) -> str | None:
    while exc is not None:
        state = getattr(exc, "sqlstate", None) or getattr(
            getattr(exc, "orig", None), "sqlstate", None
        )
        if state:
            return str(state)
        exc = exc.__cause__  # type: ignore[assignment]
    return None


async def _retry_runs_once(setup: Setup, manager: Manager, payload: Any) -> None:
    """After a refused or rolled-back attempt, a retry runs (the key is free) and commits
    one effect; a second retry replays it."""
    for _ in range(2):
        async with setup.pool.acquire() as conn, conn.transaction():
            value = await manager.execute_in_transaction(
                conn, payload, setup.effect(conn, "retry"), timeout=5
            )
        assert value == "retry"
    assert await setup.effects() == ["retry"]


# -- 1. an unfinished claim cannot commit ----------------------------------------------


async def test_a_commit_after_a_handled_timeout_is_refused(setup: Setup) -> None:
    manager = setup.manager()
    payload = {"id": "handled"}
    with pytest.raises(Exception) as refused:
        async with setup.pool.acquire() as conn, conn.transaction():

            async def slow() -> str:
                await conn.execute(f"INSERT INTO \"{setup.table}_fx\" VALUES ('partial')")
                await asyncio.sleep(30)
                return "never"

            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):  # the caller's own timeout, handled
                    await manager.execute_in_transaction(conn, payload, slow)
        # leaving the block commits: the guard refuses
    assert _sqlstate(refused.value) == _REFUSED
    from idempotency_async.stores.postgres import is_refused_commit

    assert is_refused_commit(refused.value)
    assert await setup.effects() == []  # the partial write went with the refused COMMIT
    assert await setup.row(manager, payload) is None
    await _retry_runs_once(setup, manager, payload)


async def test_a_callback_that_commits_is_refused_and_its_error_is_not_masked(
    setup: Setup,
) -> None:
    manager = setup.manager()
    payload = {"id": "commits"}
    async with setup.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()

        async def commits() -> str:
            await conn.execute(f"INSERT INTO \"{setup.table}_fx\" VALUES ('committed?')")
            await conn.execute("COMMIT")  # refused: the claim is unfinished
            raise AssertionError("the COMMIT went through")

        with pytest.raises(Exception) as failed:
            await manager.execute_in_transaction(conn, payload, commits, timeout=5)
        # The callback's own failure (its refused COMMIT), not a failed rollback.
        assert _sqlstate(failed.value) == _REFUSED
        assert not conn.is_in_transaction()  # the refused COMMIT ended the transaction
    assert await setup.effects() == []
    assert await setup.row(manager, payload) is None
    await _retry_runs_once(setup, manager, payload)


async def test_a_callback_leaving_a_savepoint_of_the_old_name_cannot_keep_the_claim(
    setup: Setup,
) -> None:
    manager = setup.manager()
    payload = {"id": "savepoint"}
    async with setup.pool.acquire() as conn, conn.transaction():

        async def nested() -> str:
            await conn.execute("SAVEPOINT idempotency_async")  # the library's old name
            await conn.execute(f"INSERT INTO \"{setup.table}_fx\" VALUES ('inner')")
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            await manager.execute_in_transaction(conn, payload, nested, timeout=5)
        await conn.execute(f"INSERT INTO \"{setup.table}_fx\" VALUES ('caller')")
    # The caller's COMMIT went through with its own write only: no claim, no inner write.
    assert await setup.effects() == ["caller"]
    assert await setup.row(manager, payload) is None


async def test_set_constraints_all_immediate_before_the_call(setup: Setup) -> None:
    manager = setup.manager()
    async with setup.pool.acquire() as conn, conn.transaction():
        await conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
        value = await manager.execute_in_transaction(
            conn, {"id": "immediate"}, setup.effect(conn, "immediate"), timeout=5
        )
    assert value == "immediate"
    assert (await setup.row(manager, {"id": "immediate"}))["status"] == "COMPLETED"


async def test_a_claim_committed_past_a_disabled_guard_frees_its_key_at_once(
    setup: Setup,
) -> None:
    # The guard switched off by an operator: the unfinished claim commits, but its lease
    # was written as already ended, so the next call — transactional or lease mode — takes
    # the key at once instead of waiting out a deadline (here, an hour: no deadline).
    manager = setup.manager()
    payload = {"id": "disabled"}
    async with setup.pool.acquire() as conn, conn.transaction():  # the store checks the guard
        await manager.execute_in_transaction(conn, {"id": "first"}, setup.effect(conn, "first"))
    await setup.pool.execute(f'ALTER TABLE "{setup.table}" DISABLE TRIGGER USER')
    async with setup.pool.acquire() as conn, conn.transaction():

        async def slow() -> str:
            await asyncio.sleep(30)
            return "never"

        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await manager.execute_in_transaction(conn, payload, slow)
    assert (await setup.row(manager, payload))["status"] == "INPROGRESS"
    await setup.pool.execute(f'ALTER TABLE "{setup.table}" ENABLE TRIGGER USER')
    # A store checking the table now would refuse it while the guard is off (tested below).
    started = time.monotonic()
    assert await manager.execute(payload, lambda: asyncio.sleep(0, "leased"), timeout=5) == (
        "leased"
    )
    assert time.monotonic() - started < 3


async def test_commit_refused_through_pgbouncer_and_sqlalchemy(
    setup: Setup, pgbouncer: Any
) -> None:
    pytest.importorskip("sqlalchemy")
    import asyncpg
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    manager = setup.manager()
    # PgBouncer in transaction mode (asyncpg without named prepared statements).
    conn = await asyncpg.connect(pgbouncer.dsn, statement_cache_size=0)
    try:
        with pytest.raises(Exception) as refused:
            async with conn.transaction():
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.3):
                        await manager.execute_in_transaction(
                            conn, {"id": "bouncer"}, lambda: asyncio.sleep(30)
                        )
        assert _sqlstate(refused.value) == _REFUSED
    finally:
        await conn.close()
    # SQLAlchemy: the refusal arrives wrapped in its DBAPIError.
    url = setup.server.dsn.replace("postgres://", "postgresql+asyncpg://")
    engine = create_async_engine(url)
    try:
        with pytest.raises(Exception) as wrapped:
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(text("SELECT 1"))
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.3):
                        await manager.execute_in_transaction(
                            session, {"id": "orm"}, lambda: asyncio.sleep(30)
                        )
        assert _sqlstate(wrapped.value) == _REFUSED
    finally:
        await engine.dispose()
    for payload in ({"id": "bouncer"}, {"id": "orm"}):
        assert await setup.row(manager, payload) is None


# -- 2. one engine per session ------------------------------------------------------------


async def test_a_session_bound_to_two_engines_or_none_is_refused(setup: Setup) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.orm import DeclarativeBase

    class Base(DeclarativeBase):
        pass

    class Payment(Base):
        __tablename__ = f"{setup.table}_fx"
        id = sqlalchemy.Column(sqlalchemy.Text, primary_key=True)

    url = setup.server.dsn.replace("postgres://", "postgresql+asyncpg://")
    records, payments = create_async_engine(url), create_async_engine(url)
    manager = setup.manager()
    try:
        two = AsyncSession(bind=records, binds={Payment: payments})
        none = AsyncSession(binds={Payment: payments, Base: records})
        for session, why in ((two, "bound to one engine; this one has 2"), (none, "one engine")):
            async with session, session.begin():
                with pytest.raises(errors.ConfigError, match=why):
                    await manager.execute_in_transaction(
                        session, {"id": "two"}, lambda: asyncio.sleep(0, "x")
                    )
        # One engine through binds only (no default bind) is one transaction: accepted.
        async with AsyncSession(binds={Payment: records}) as one, one.begin():

            async def pay() -> str:
                one.add(Payment(id="paid"))
                await one.flush()
                return "paid"

            assert await manager.execute_in_transaction(one, {"id": "one"}, pay) == "paid"
        assert await setup.effects() == ["paid"]
        # An engine passed by mistake: ConfigError, not AttributeError.
        with pytest.raises(errors.ConfigError, match="engine"):
            await manager.execute_in_transaction(records, {"id": "e"}, lambda: asyncio.sleep(0))
    finally:
        await records.dispose()
        await payments.dispose()


# -- 3. lease mode follows wait=None ----------------------------------------------------


async def test_a_lease_mode_duplicate_with_wait_off_does_not_wait_for_an_open_transaction(
    setup: Setup,
) -> None:
    transactional, leased = setup.manager(), setup.manager(wait=None)
    payload = {"id": "held"}
    claimed = asyncio.Event()
    release = asyncio.Event()

    async def hold() -> None:
        async with setup.pool.acquire() as conn, conn.transaction():

            async def held() -> str:
                claimed.set()
                await release.wait()
                return "held"

            await transactional.execute_in_transaction(conn, payload, held, timeout=10)

    holder = asyncio.create_task(hold())
    try:
        await claimed.wait()
        started = time.monotonic()
        with pytest.raises(errors.AlreadyInProgressError):
            await leased.execute(payload, lambda: asyncio.sleep(0, "dup"), timeout=2)
        assert time.monotonic() - started < 0.8  # not its 2 s deadline
    finally:
        release.set()
        await holder
    assert await leased.execute(payload, lambda: asyncio.sleep(0, "dup"), timeout=2) == "held"


# -- 4. a migration's lock does not outlive the deadline -------------------------------


async def _under_a_migration_lock(setup: Setup, calls: dict[str, Any]) -> dict[str, Any]:
    """Run ``calls`` (name: coroutine function) while another connection holds ACCESS
    EXCLUSIVE on the table; what each raised, and after how long.  Given up after 8 s (the
    lock is then released so that nothing hangs)."""
    migration = await setup.server.connect()
    outcomes: dict[str, Any] = {}

    async def timed(name: str) -> None:
        started = time.monotonic()
        try:
            await calls[name]()
            outcomes[name] = (time.monotonic() - started, None)
        except Exception as exc:
            outcomes[name] = (time.monotonic() - started, exc)

    try:
        await migration.execute("BEGIN")
        await migration.execute(f'LOCK TABLE "{setup.table}" IN ACCESS EXCLUSIVE MODE')
        tasks = [asyncio.create_task(timed(name)) for name in calls]
        await asyncio.wait(tasks, timeout=8)
    finally:
        await migration.execute("ROLLBACK")
        await migration.close()
    await asyncio.gather(*tasks)
    return outcomes


# The deadline (1 s), plus the completion reserve for the release after an unanswered claim
# (0.2 s), plus a generous 1.5 s for a loaded machine — not the lock's 8 s.
_BOUND = 1 + 0.2 + 1.5


async def test_a_table_lock_does_not_outlive_the_deadline(setup: Setup) -> None:
    lease_mode = setup.manager()
    waiting = setup.manager(wait=Wait(timeout=30))

    async def transactional() -> None:
        async with setup.pool.acquire() as conn, conn.transaction():
            await waiting.execute_in_transaction(
                conn, {"id": "tx"}, setup.effect(conn, "tx"), timeout=1
            )

    outcomes = await _under_a_migration_lock(
        setup,
        {
            "execute": lambda: lease_mode.execute(
                {"id": "new"}, lambda: asyncio.sleep(0), timeout=1
            ),
            "transactional": transactional,
        },
    )
    for name, (seconds, error) in outcomes.items():
        assert seconds < _BOUND, (name, seconds, error)
    assert isinstance(outcomes["execute"][1], errors.DeadlineExceededError)
    # The claim's own lock_timeout covers the table lock: a refusal, the caller's
    # transaction intact.
    assert isinstance(outcomes["transactional"][1], errors.LockTimeoutError)


async def test_manager_replay_takes_a_deadline(setup: Setup) -> None:
    manager = setup.manager()
    await manager.execute({"id": "done"}, lambda: asyncio.sleep(0, "done"), timeout=5)

    async def replay() -> Any:
        return await manager.replay({"id": "done"}, default=None, **_deadline(1))

    outcomes = await _under_a_migration_lock(setup, {"replay": replay})
    seconds, error = outcomes["replay"]
    assert seconds < _BOUND
    assert isinstance(error, errors.DeadlineExceededError), error


def _deadline(seconds: float) -> dict[str, float]:
    """``timeout=seconds`` for ``Manager.replay`` where it takes one."""
    import inspect

    return {"timeout": seconds} if "timeout" in inspect.signature(Manager.replay).parameters else {}


# -- 5. bounded reads ------------------------------------------------------------------


async def test_rows_are_read_back_bounded(setup: Setup) -> None:
    manager = setup.manager()
    big, reason, owner = ({"id": name} for name in ("big", "reason", "owner"))
    insert = (
        f'INSERT INTO "{setup.table}" (key, status, owner, expires_at, validation, response, '
        "not_stored) VALUES ($1, 'COMPLETED', $2, now() + interval '1 hour', NULL, $3::jsonb, $4)"
    )
    await setup.pool.execute(
        insert, manager.key_for(big), "o", '{"x": "' + "a" * 20_000_000 + '"}', None
    )
    await setup.pool.execute(insert, manager.key_for(reason), "o", None, "r" * 4_000_000)
    await setup.pool.execute(insert, manager.key_for(owner), "o" * 4_000_000, '"v"', None)
    tracemalloc.start()
    try:
        with pytest.raises(errors.ResponseNotStoredError) as unreadable:
            await manager.replay(big, default=None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8_000_000  # the server sent at most 4 x max_response_bytes of it
    assert "larger than the store reads" in str(unreadable.value)
    with pytest.raises(errors.ResponseNotStoredError) as not_stored:
        await manager.replay(reason, default=None)
    assert len(not_stored.value.reason or "") <= 300
    with pytest.raises(errors.InconsistentStateError, match="owner is longer"):
        await manager.replay(owner, default=None)


# -- 6. the right errors ----------------------------------------------------------------


async def test_a_statement_timeout_during_the_lock_wait_is_a_lock_timeout(setup: Setup) -> None:
    manager = setup.manager(wait=Wait(timeout=10))
    claimed, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with setup.pool.acquire() as conn, conn.transaction():

            async def held() -> str:
                claimed.set()
                await release.wait()
                return "held"

            await manager.execute_in_transaction(conn, {"id": "k"}, held, timeout=10)

    holder = asyncio.create_task(hold())
    try:
        await claimed.wait()
        async with setup.pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL statement_timeout = '200ms'")
            with pytest.raises(errors.LockTimeoutError):
                await manager.execute_in_transaction(
                    conn, {"id": "k"}, setup.effect(conn, "dup"), timeout=10
                )
            await conn.execute(f"INSERT INTO \"{setup.table}_fx\" VALUES ('mine')")
    finally:
        release.set()
        await holder
    assert sorted(await setup.effects()) == ["mine"]  # the duplicate's transaction went on


async def test_repeatable_read_meeting_a_lease_mode_holder_is_a_serialization_failure(
    setup: Setup,
) -> None:
    lease_mode = setup.manager()
    transactional = setup.manager(wait=Wait(timeout=5))
    started_holding, release = asyncio.Event(), asyncio.Event()

    async def held() -> str:
        started_holding.set()
        await release.wait()
        return "leased"

    holder = asyncio.create_task(lease_mode.execute({"id": "k"}, held, timeout=10))
    try:
        await started_holding.wait()
        started = time.monotonic()
        async with setup.pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            with pytest.raises(errors.SerializationFailureError):
                await transactional.execute_in_transaction(
                    conn, {"id": "k"}, setup.effect(conn, "dup"), timeout=10
                )
        assert time.monotonic() - started < 2  # at once, not after the 5 s wait
    finally:
        release.set()
        await holder


async def test_a_malformed_dsn_is_a_config_error(setup: Setup) -> None:
    store = PostgresStore.from_url("postgres://user:s3cret@localhost:notaport/db")
    manager = Manager(store, Options(key_prefix="dsn"))
    with pytest.raises(errors.ConfigError) as bad:
        await manager.execute({"id": 1}, lambda: asyncio.sleep(0), timeout=2)
    assert "s3cret" not in str(bad.value)
    with pytest.raises(errors.ConfigError):
        await create_table("postgres://user@localhost:notaport/db", table=fresh_table_name())
    await store.aclose()


async def test_a_table_whose_guard_is_disabled_is_refused(setup: Setup) -> None:
    await setup.pool.execute(f'ALTER TABLE "{setup.table}" DISABLE TRIGGER USER')
    manager = setup.manager()
    async with setup.pool.acquire() as conn, conn.transaction():
        with pytest.raises(errors.ConfigError, match="guard trigger"):
            await manager.execute_in_transaction(conn, {"id": "k"}, setup.effect(conn, "k"))
