"""Running one transactional scenario on a real Postgres: tables of its own, each call in
its own transaction on its own connection, and what committed read back afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from idempotency_async.errors import AlreadyInProgressError, DeadlineExceededError
from idempotency_async.manager import Manager
from idempotency_async.options import LocalCache, Options, Wait
from idempotency_async.stores.postgres import PostgresStore, create_table
from idempotency_async.testing._quiet import quiet_library
from idempotency_async.testing._tx_scenario import TxCallPlan, TxScenario

__all__ = [
    "CALLER_LOCK_TIMEOUT",
    "OTHER_KEY",
    "TxCallbackFailed",
    "TxOutcome",
    "TxTrace",
    "run_transactional",
]

_MISSING: Any = object()
CALLER_LOCK_TIMEOUT = "7s"
"""The ``lock_timeout`` every simulated caller sets in its transaction before the call."""


class TxCallbackFailed(Exception):
    """What a simulated transactional callback raises on purpose."""


@dataclass(slots=True)
class TxOutcome:
    """What one caller did and got."""

    call: int
    writer: str
    """The callback's result, and the ``writer`` of its effect row."""
    began: float
    entered: float | None = None
    exited: float | None = None
    value: Any = _MISSING
    error: BaseException | None = None
    ran: bool = False
    returned: bool = False
    raised: BaseException | None = None
    """What the callback raised: its own exception, or its own statement's failure."""
    cancel_requested: bool = False
    committed: bool | None = False
    """``True``: COMMIT answered; ``False``: rolled back or never sent; ``None``: COMMIT
    sent and the connection lost before its answer (either may have happened)."""
    commit_error: str | None = None
    commit_state: str | None = None
    """The SQLSTATE of a refused COMMIT (40001: a serialization failure)."""
    lock_timeout: str | None = None
    """The transaction's ``lock_timeout`` after the call (the caller set
    ``CALLER_LOCK_TIMEOUT``), read when the call left the transaction usable."""
    undone: bool = False
    """The caller rolled back to a savepoint taken before the call (``caller_savepoint``):
    nothing of the call can commit with its transaction."""
    second_value: Any = _MISSING
    second_error: BaseException | None = None
    """A second call in the same transaction (``again_same_key``, ``again_other_key``)."""
    second_ran: bool = False
    second_raised: BaseException | None = None
    second_writer: str | None = None
    """``again_other_key``: the writer of the second call's run (its key is its own)."""
    two_engines: bool = False
    """The call was made on a SQLAlchemy session bound to two engines."""

    @property
    def returned_value(self) -> bool:
        return self.value is not _MISSING

    @property
    def second_returned(self) -> bool:
        return self.second_value is not _MISSING


@dataclass(slots=True)
class TxTrace:
    """A transactional scenario's outcomes, and the tables it left."""

    scenario: TxScenario
    outcomes: list[TxOutcome]
    records: list[tuple[str, str, str | None]] = field(default_factory=list)
    """Every record row: (key, status, response as JSON text)."""
    effects: list[tuple[int, str]] = field(default_factory=list)
    """Every committed effect row: (the scenario's key index, writer)."""
    attempts: set[str] = field(default_factory=set)
    """The writers whose own write before the call committed."""
    unfinished: list[int] = field(default_factory=list)


# The errors after which the caller's transaction is still usable: only the library's
# savepoint was rolled back, and the caller commits its own writes.
_USABLE = (TxCallbackFailed, AlreadyInProgressError, DeadlineExceededError)
OTHER_KEY = 1000
"""A second call of another key (``again_other_key``) uses key index 1000 + the call's."""


async def run_transactional(
    scenario: TxScenario, pool: Any, dsn: str, *, stuck_after: float = 60.0
) -> TxTrace:
    """Run ``scenario`` on the server at ``dsn``: an asyncpg ``pool`` gives the asyncpg
    callers their connections (psycopg callers connect on their own)."""
    name = f"idem_tx_{secrets.token_hex(6)}"
    effects, attempts, deferred = f'"{name}_e"', f'"{name}_a"', f'"{name}_d"'
    await create_table(pool, table=name)
    await pool.execute(f"CREATE TABLE {effects} (key int NOT NULL, writer text NOT NULL)")
    await pool.execute(f"CREATE TABLE {attempts} (writer text NOT NULL)")
    await pool.execute(f"CREATE TABLE {deferred} (v text UNIQUE DEFERRABLE INITIALLY DEFERRED)")
    store = PostgresStore(pool, table=name)
    managers = [
        Manager(
            store,
            Options(
                key_prefix=f"tx{scenario.seed}",
                event_key_jmespath="id",
                wait=Wait(timeout=plan.wait_timeout) if plan.wait else None,
                local_cache=LocalCache() if plan.use_local_cache else None,
            ),
        )
        for plan in scenario.managers
    ]
    _import_drivers(scenario)  # before the clock starts: an import blocks the loop
    killer = await pool.acquire()
    killing = asyncio.Lock()
    dropped: list[int] = []  # backends whose client went away: they may still be finishing
    loop = asyncio.get_running_loop()
    start = loop.time()
    trace = TxTrace(scenario, [TxOutcome(i, f"c{i}", 0.0) for i in range(len(scenario.calls))])

    async def drive(index: int, plan: TxCallPlan) -> None:
        outcome = trace.outcomes[index]
        await asyncio.sleep(max(0.0, start + plan.at - loop.time()))
        outcome.began = loop.time()
        if plan.mode == "lease":
            await _leased(plan, outcome)
            return
        if plan.driver == "two_engines" and await _two_engines(plan, outcome):
            return
        caller = await _caller(plan.driver, pool, dsn)
        try:
            await _transaction(plan, outcome, caller)
        finally:
            await caller.close()

    async def _leased(plan: TxCallPlan, outcome: TxOutcome) -> None:
        """A lease-mode call of the same key: its effect is one autocommit statement,
        written last (nothing cuts it off: it has no deadline)."""
        await pool.execute(f"INSERT INTO {attempts} VALUES ($1)", outcome.writer)

        async def callback() -> str:
            outcome.ran = True
            await asyncio.sleep(plan.duration)
            await pool.execute(f"INSERT INTO {effects} VALUES ($1, $2)", plan.key, outcome.writer)
            outcome.returned = True
            return outcome.writer

        outcome.entered = loop.time()
        try:
            outcome.value = await managers[plan.manager].execute({"id": plan.key}, callback)
        except Exception as exc:  # the outcome is the subject under test
            outcome.error = exc
        finally:
            outcome.exited = loop.time()
        outcome.committed = True  # (autocommit: what it wrote is committed)

    async def _two_engines(plan: TxCallPlan, outcome: TxOutcome) -> bool:
        """A SQLAlchemy session bound to two engines: refused before any statement.  False
        when SQLAlchemy is not installed (the call then runs on asyncpg)."""
        try:
            import sqlalchemy
            from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
        except ImportError:
            return False
        url = dsn.replace("postgres://", "postgresql+asyncpg://", 1)
        engines = [create_async_engine(url), create_async_engine(url)]
        payments = sqlalchemy.Table(f"{name}_e", sqlalchemy.MetaData())
        try:
            session = AsyncSession(bind=engines[0], binds={payments: engines[1]})
            outcome.two_engines = True
            async with session, session.begin():
                outcome.entered = loop.time()
                try:
                    outcome.value = await managers[plan.manager].execute_in_transaction(
                        session, {"id": plan.key}, lambda: asyncio.sleep(0, outcome.writer)
                    )
                except Exception as exc:
                    outcome.error = exc
                finally:
                    outcome.exited = loop.time()
                await session.rollback()
        finally:
            for engine in engines:
                await engine.dispose()
        return True

    async def _transaction(plan: TxCallPlan, outcome: TxOutcome, caller: _Caller) -> None:
        await caller.begin(plan.isolation)
        if plan.early_snapshot:
            await caller.fetchval("SELECT 1")
        await caller.execute(f"INSERT INTO {attempts} VALUES ($1)", outcome.writer)
        await caller.execute(f"SET LOCAL lock_timeout = '{CALLER_LOCK_TIMEOUT}'")
        if plan.fault == "commit_fails":
            await caller.execute(f"INSERT INTO {deferred} VALUES ('x'), ('x')")
        if plan.fault == "caller_savepoint":
            await caller.execute("SAVEPOINT caller")

        def callback_for(key: int, writer: str, second: bool) -> Callable[[], Awaitable[str]]:
            async def callback() -> str:
                if second:
                    outcome.second_ran = True
                else:
                    outcome.ran = True
                try:
                    if plan.fault == "old_savepoint":
                        await caller.execute("SAVEPOINT idempotency_async")
                    await caller.execute(f"INSERT INTO {effects} VALUES ($1, $2)", key, writer)
                    if plan.fault == "kill_backend":
                        async with killing:
                            await killer.execute("SELECT pg_terminate_backend($1)", caller.pid)
                    if plan.fault == "callback_commits":
                        await caller.execute("COMMIT")  # refused: the claim is unfinished
                    await asyncio.sleep(3600.0 if plan.behaviour == "hang" else plan.duration)
                    if plan.behaviour == "raise":
                        raise TxCallbackFailed(writer)
                except Exception as exc:
                    if second:
                        outcome.second_raised = exc
                    else:
                        outcome.raised = exc
                    raise
                if not second:
                    outcome.returned = True
                return writer

            return callback

        outcome.entered = loop.time()
        call = asyncio.create_task(
            managers[plan.manager].execute_in_transaction(
                caller.connection,
                {"id": plan.key},
                callback_for(plan.key, outcome.writer, False),
                timeout=plan.timeout,
            )
        )

        def cancel() -> None:
            if not call.done():
                outcome.cancel_requested = True
                call.cancel()

        timed = plan.fault in ("cancel", "commit_after_timeout")
        timer = loop.call_later(plan.fault_after, cancel) if timed else None
        try:
            outcome.value = await call
        except BaseException as exc:  # the outcome is the subject under test
            outcome.error = exc
        finally:
            outcome.exited = loop.time()
            if timer is not None:
                timer.cancel()
        if caller.gone():
            return
        # The caller's own timeout, handled: it goes on and commits (misuse).
        handled = plan.fault == "commit_after_timeout" and outcome.cancel_requested
        spoiled = outcome.error is not None and not isinstance(outcome.error, _USABLE)
        # (A callback that committed ended the transaction: nothing is left to commit.)
        undone = ("rollback_after_return", "cancel", "callback_commits")
        if (spoiled and not handled) or plan.fault in undone:
            try:
                await caller.execute("ROLLBACK")
            except Exception:
                await caller.drop()
            return
        if not handled:
            try:
                outcome.lock_timeout = str(await caller.fetchval("SHOW lock_timeout"))
            except Exception as exc:
                outcome.lock_timeout = f"unreadable: {exc!r}"
        if plan.fault in ("again_same_key", "again_other_key"):
            key, writer = plan.key, outcome.writer
            if plan.fault == "again_other_key":
                key, writer = OTHER_KEY + outcome.call, f"{outcome.writer}x"
                outcome.second_writer = writer
            try:
                outcome.second_value = await managers[plan.manager].execute_in_transaction(
                    caller.connection,
                    {"id": key},
                    callback_for(key, writer, True),
                    timeout=plan.timeout,
                )
            except Exception as exc:
                outcome.second_error = exc
                if not isinstance(exc, _USABLE):
                    with contextlib.suppress(Exception):
                        await caller.execute("ROLLBACK")
                    return
        if plan.fault == "caller_savepoint":
            await caller.execute("ROLLBACK TO SAVEPOINT caller")
            outcome.undone = True
        await asyncio.sleep(plan.hold)
        if plan.fault in ("close_socket", "commit_unanswered"):
            dropped.append(caller.pid)
        if plan.fault == "close_socket":
            await caller.drop()
            return
        if plan.fault == "commit_unanswered":
            outcome.committed = await caller.commit_unanswered()
            return
        try:
            await caller.execute("COMMIT")
            outcome.committed = True
        except Exception as exc:
            outcome.commit_error = f"{type(exc).__name__}: {exc}"
            outcome.commit_state = getattr(exc, "sqlstate", None)
            with contextlib.suppress(Exception):
                await caller.execute("ROLLBACK")

    async def lock_the_table(when: float, seconds: float) -> None:
        """A migration: ACCESS EXCLUSIVE on the record table for ``seconds``."""
        await asyncio.sleep(max(0.0, start + when - loop.time()))
        migration = await pool.acquire()
        try:
            await migration.execute("BEGIN")
            await migration.execute("SET LOCAL lock_timeout = '5s'")
            # (A migration that gave up waiting for the lock holds none: nothing to do.)
            with contextlib.suppress(Exception):
                await migration.execute(f'LOCK TABLE "{name}" IN ACCESS EXCLUSIVE MODE')
                await asyncio.sleep(seconds)
        finally:
            with contextlib.suppress(Exception):
                await migration.execute("ROLLBACK")
            await pool.release(migration)

    tasks: list[asyncio.Task[None]] = []
    try:
        with quiet_library():
            tasks += [
                asyncio.create_task(drive(index, plan)) for index, plan in enumerate(scenario.calls)
            ]
            if scenario.table_lock is not None:
                tasks.append(asyncio.create_task(lock_the_table(*scenario.table_lock)))
            _, pending = await asyncio.wait(tasks, timeout=stuck_after)
            trace.unfinished = [tasks.index(task) for task in pending]
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"call {tasks.index(task)}'s harness failed") from (
                        task.exception()
                    )
        await _gone_from_the_server(killer, dropped)
        async with pool.acquire() as reader, reader.transaction(isolation="repeatable_read"):
            rows = await reader.fetch(f'SELECT key, status, response::text FROM "{name}"')
            trace.records = [(row[0], row[1], row[2]) for row in rows]
            rows = await reader.fetch(f"SELECT * FROM {effects}")
            trace.effects = [(row[0], row[1]) for row in rows]
            trace.attempts = {row[0] for row in await reader.fetch(f"SELECT * FROM {attempts}")}
    finally:
        # Nothing of the scenario outlives it (this run may itself be cancelled).
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await pool.release(killer)
        for table in (f'"{name}"', effects, attempts, deferred):
            with contextlib.suppress(Exception):
                await pool.execute(f"DROP TABLE IF EXISTS {table}")
    return trace


class _Caller:
    """A caller's connection: asyncpg's (from the pool) or psycopg's, driven with plain SQL
    (``BEGIN``/``COMMIT``/``ROLLBACK``), as a caller's transaction block would."""

    connection: Any
    pid: int

    async def begin(self, isolation: str) -> None:
        await self.execute(f"BEGIN ISOLATION LEVEL {isolation.replace('_', ' ').upper()}")

    async def execute(self, sql: str, *args: Any) -> None:
        raise NotImplementedError

    async def fetchval(self, sql: str) -> Any:
        raise NotImplementedError

    def gone(self) -> bool:
        raise NotImplementedError

    async def drop(self) -> None:
        """Close the connection without a word: the server aborts its transaction."""
        raise NotImplementedError

    async def commit_unanswered(self) -> bool | None:
        """Send COMMIT and drop the connection before reading the answer: ``None``."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class _AsyncpgCaller(_Caller):
    def __init__(self, pool: Any, connection: Any) -> None:
        self._pool = pool
        self.connection = connection
        self.pid = connection.get_server_pid()

    async def execute(self, sql: str, *args: Any) -> None:
        await self.connection.execute(sql, *args)

    async def fetchval(self, sql: str) -> Any:
        return await self.connection.fetchval(sql)

    def gone(self) -> bool:
        # A pool's proxy of a terminated connection refuses every method, this one too.
        try:
            return bool(self.connection.is_closed())
        except Exception:
            return True

    async def drop(self) -> None:
        self.connection.terminate()

    async def commit_unanswered(self) -> bool | None:
        commit = asyncio.create_task(self.connection.execute("COMMIT"))
        await asyncio.sleep(0)  # the COMMIT is on the wire; its answer is not read
        self.connection.terminate()
        try:
            await commit
        except Exception:
            return None
        return True

    async def close(self) -> None:
        try:
            await self._pool.release(self.connection)
        except Exception:
            self.connection.terminate()


class _PsycopgCaller(_Caller):
    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.pid = connection.info.backend_pid

    async def execute(self, sql: str, *args: Any) -> None:
        await self.connection.execute(re.sub(r"\$\d+", "%s", sql), args or None)

    async def fetchval(self, sql: str) -> Any:
        row = await (await self.connection.execute(sql)).fetchone()
        return None if row is None else row[0]

    def gone(self) -> bool:
        return bool(self.connection.closed or self.connection.broken)

    async def drop(self) -> None:
        await self.connection.close()

    async def commit_unanswered(self) -> bool | None:  # not generated for psycopg
        await self.connection.close()
        return False

    async def close(self) -> None:
        await self.connection.close()


async def _caller(driver: str, pool: Any, dsn: str) -> _Caller:
    if driver == "psycopg":
        try:
            import psycopg
        except ImportError:
            pass  # psycopg is optional: the call goes through asyncpg
        else:
            return _PsycopgCaller(await psycopg.AsyncConnection.connect(dsn, autocommit=True))
    return _AsyncpgCaller(pool, await pool.acquire())


def _import_drivers(scenario: TxScenario) -> None:
    """Import the optional drivers the scenario's callers use now: imported mid-scenario
    (psycopg, SQLAlchemy: a fraction of a second) they would block the event loop under
    every call in flight, and lock waits would look longer than they were."""
    drivers = {plan.driver for plan in scenario.calls}
    modules = {
        "psycopg": ("psycopg",),
        "two_engines": ("sqlalchemy.ext.asyncio", "sqlalchemy.dialects.postgresql.asyncpg"),
    }
    for driver in drivers:
        for module in modules.get(driver, ()):
            with contextlib.suppress(ImportError):
                importlib.import_module(module)


async def _gone_from_the_server(observer: Any, pids: list[int], seconds: float = 30.0) -> None:
    """Wait until the backends of dropped connections ended: a COMMIT whose client went
    away may still be applying when the client moved on."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + seconds
    while pids and loop.time() < give_up:
        alive = await observer.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", pids
        )
        if alive == 0:
            return
        await asyncio.sleep(0.01)
