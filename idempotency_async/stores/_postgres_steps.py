"""Transactional steps on the Postgres store: a step's own transaction on the caller's
connection (``step(name, fn, connection=conn)``).

The connection must not be in a transaction: the step opens one (``BEGIN``), ``fn`` runs
its statements in it, and the recovery point is written through the same connection by
the table's step function (schema version 3), which raises ``STEP_LOST`` when the owner's
in-progress row is absent or holds another number of steps — the transaction then cannot
commit, so the step's writes never commit without their recovery point.  On asyncpg and
psycopg 3 the write and the ``COMMIT`` go in one round trip (``SELECT step(…); COMMIT``,
values as literals); under SQLAlchemy the write is a statement of its own and SQLAlchemy
commits (its transaction object must see its own ``COMMIT``).  A step that raises, or a
write that fails, rolls the transaction back.

The transaction is the step's own, opened and committed by the library: unlike
``execute_in_transaction``, nothing here runs in a transaction of the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final

from idempotency_async.errors import ConfigError, StoreUnavailableError
from idempotency_async.stores._postgres_errors import translated
from idempotency_async.stores._postgres_psycopg import PsycopgConnection, is_psycopg_connection
from idempotency_async.stores._postgres_schema import STEP_LOST, Schema, step_script
from idempotency_async.stores.base import Stepped, StepWrite

__all__ = ["begin_step"]

_ROLLBACK_SECONDS: Final = 2.0
_IN_TRANSACTION: Final = (
    "a transactional step opens its own transaction on the connection, which is in one "
    "already: call step(..., connection=conn) outside `async with conn.transaction():` / "
    "`session.begin()` (inside execute_in_transaction, a step needs no connection: the "
    "whole call commits as one)"
)
_NOT_A_CONNECTION: Final = (
    "step(..., connection=...) takes the connection the step's writes go through: an "
    "asyncpg Connection, a psycopg AsyncConnection, or a SQLAlchemy AsyncConnection or "
    "AsyncSession"
)


class _Step:
    """What every driver shares: the write, its errors, the rollback."""

    def __init__(self, schema: Schema, table: str, client_clock: bool, limit: int) -> None:
        self._schema = schema
        self._table = table
        self._client_clock = client_clock
        self._limit = limit
        self._open = True

    async def record(self, write: StepWrite) -> Stepped:
        steps = write.steps
        if len(steps) > self._limit or len(steps.encode("utf-8", "surrogatepass")) > self._limit:
            return Stepped.TOO_LARGE  # nothing sent: the transaction stays open
        try:
            await self._write_and_commit(write, write.now if self._client_clock else None)
        except BaseException as exc:
            await self.rollback()
            if getattr(exc, "sqlstate", None) == STEP_LOST:
                return Stepped.LOST
            if isinstance(exc, Exception):
                error = _translated(exc, write.key, self._table)
                if error is not exc:
                    raise error from exc
            raise
        self._open = False
        return Stepped.RECORDED

    async def rollback(self) -> None:
        if not self._open:
            return
        self._open = False
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_ROLLBACK_SECONDS):
                await self._rollback()

    async def _write_and_commit(self, write: StepWrite, now: float | None) -> None:
        raise NotImplementedError

    async def _rollback(self) -> None:
        raise NotImplementedError

    def _script(self, write: StepWrite, now: float | None) -> str:
        return step_script(
            self._schema.step_function,
            write.key,
            write.owner,
            now,
            write.ttl,
            write.position,
            write.steps,
        )

    def _arguments(self, write: StepWrite, now: float | None) -> tuple[Any, ...]:
        return (write.key, write.owner, now, float(write.ttl), int(write.position), write.steps)


class _AsyncpgStep(_Step):
    """On an asyncpg connection (or a pool's connection proxy): raw ``BEGIN`` and
    ``COMMIT`` (asyncpg tracks the server's transaction status itself)."""

    def __init__(self, connection: Any, *args: Any) -> None:
        super().__init__(*args)
        self._connection = connection

    async def begin(self) -> None:
        await self._connection.execute("BEGIN")

    async def _write_and_commit(self, write: StepWrite, now: float | None) -> None:
        await self._connection.execute(self._script(write, now))  # simple protocol

    async def _rollback(self) -> None:
        if self._connection.is_in_transaction():
            await self._connection.execute("ROLLBACK")


class _PsycopgStep(_Step):
    """On a psycopg ``AsyncConnection``, in autocommit mode or not (out of it, psycopg
    opens the transaction itself with the first statement; libpq tracks the status)."""

    def __init__(self, connection: Any, *args: Any) -> None:
        super().__init__(*args)
        self._connection = connection

    async def begin(self) -> None:
        if self._connection.autocommit:
            await self._connection.execute("BEGIN")

    async def _write_and_commit(self, write: StepWrite, now: float | None) -> None:
        await PsycopgConnection(self._connection).script(self._script(write, now))

    async def _rollback(self) -> None:
        if PsycopgConnection(self._connection).in_transaction(aborted=True):
            await self._connection.rollback()


class _SqlAlchemyStep(_Step):
    """On a SQLAlchemy ``AsyncConnection`` or ``AsyncSession``: SQLAlchemy opens and
    commits the transaction (its objects must see both); the recovery point is written
    through the driver connection underneath, in that transaction."""

    def __init__(self, target: Any, session: bool, *args: Any) -> None:
        super().__init__(*args)
        self._target = target
        self._session = session
        self._transaction: Any = None

    async def begin(self) -> None:
        self._transaction = await self._target.begin()

    async def _write_and_commit(self, write: StepWrite, now: float | None) -> None:
        target = self._target
        if self._session:
            await target.flush()  # the step's objects, in the transaction, before the point
            core = await target.connection()
        else:
            core = target
        driver = (await core.get_raw_connection()).driver_connection
        arguments = self._arguments(write, now)
        if is_psycopg_connection(driver):
            await PsycopgConnection(driver).fetchrow(self._schema.record_step, *arguments)
        else:
            if not driver.is_in_transaction():
                # SQLAlchemy's asyncpg adapter sends BEGIN with the first statement.
                await core.exec_driver_sql("SELECT 1")
            await driver.fetchrow(self._schema.record_step, *arguments)
        await self._transaction.commit()

    async def _rollback(self) -> None:
        if self._transaction is not None and self._transaction.is_active:
            await self._transaction.rollback()


async def begin_step(
    connection: Any, schema: Schema, table: str, client_clock: bool, limit: int
) -> _Step:
    """The step's transaction, opened on ``connection`` (``ConfigError`` before any
    statement when it is not a connection of a supported driver, or is in a transaction)."""
    shared = (schema, table, client_clock, limit)
    step: _AsyncpgStep | _PsycopgStep | _SqlAlchemyStep
    module = type(connection).__module__
    name = type(connection).__name__
    if module.startswith("sqlalchemy"):
        if name not in ("AsyncConnection", "AsyncSession") or not hasattr(connection, "begin"):
            raise ConfigError(f"{_NOT_A_CONNECTION}; got SQLAlchemy's {name}")
        if connection.in_transaction():
            raise ConfigError(_IN_TRANSACTION)
        session = name == "AsyncSession"
        if session and (connection.new or connection.dirty or connection.deleted):
            raise ConfigError(
                "a transactional step needs a session without unflushed changes: they would "
                "commit with the step. Flush or commit them before the step"
            )
        step = _SqlAlchemyStep(connection, session, *shared)
    elif is_psycopg_connection(connection):
        wrapped = PsycopgConnection(connection)
        if wrapped.in_transaction(aborted=True):
            raise ConfigError(_IN_TRANSACTION)
        step = _PsycopgStep(connection, *shared)
    elif callable(getattr(connection, "is_in_transaction", None)) and callable(
        getattr(connection, "fetchrow", None)
    ):
        if connection.is_in_transaction():
            raise ConfigError(_IN_TRANSACTION)
        step = _AsyncpgStep(connection, *shared)
    else:
        raise ConfigError(
            f"{_NOT_A_CONNECTION}; got {type(connection).__name__} (a pool or an engine "
            "holds no transaction: acquire a connection from it, or open a session)"
        )
    try:
        await step.begin()
    except Exception as exc:
        error = _translated(exc, "", table)
        if error is exc:
            raise
        raise error from exc
    return step


def _translated(exc: Exception, key: str, table: str) -> Exception:
    if getattr(exc, "sqlstate", None) == "42883":  # undefined function: not migrated
        return ConfigError(
            f"a transactional step of key {key} could not write its recovery point ({exc}): "
            f"the connection's database lacks the step function of {table} (schema version "
            "3): run `idempotency-async migrate`, and pass a connection to the database the "
            "store's table is in"
        )
    error = translated(exc, "transactional step", key, table)
    if error is exc and isinstance(exc, OSError | TimeoutError):
        return StoreUnavailableError(f"a transactional step of key {key} failed: {exc!r}")
    return error
