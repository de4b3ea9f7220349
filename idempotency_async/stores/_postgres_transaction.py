"""The Postgres store inside a caller's transaction (``Manager.execute_in_transaction``).

Every statement runs on the caller's connection, inside a savepoint the library opens
(``idempotency_async``) and always closes before the call returns: released with the
completion, rolled back (with the claim) when the callback fails, is cut off, or the claim
is refused.  The library never commits nor rolls back the caller's transaction, and leaves
no session state: the lock timeout it sets is transaction-local and put back.

The connection may be asyncpg's, psycopg 3's, or SQLAlchemy's ``AsyncConnection`` /
``AsyncSession`` (whose driver connection runs the statements; see :func:`bind`).
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from idempotency_async.errors import (
    ConfigError,
    DeadlockDetectedError,
    LockTimeoutError,
    SerializationFailureError,
)
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores._postgres_errors import translated
from idempotency_async.stores._postgres_psycopg import PsycopgConnection, is_psycopg_connection
from idempotency_async.stores._postgres_sql import (
    SAVEPOINT_BEGIN,
    SAVEPOINT_RELEASE,
    SAVEPOINT_UNDO,
    Statements,
    lock_wait,
)
from idempotency_async.stores._postgres_values import (
    claim_verdict,
    completion_text,
    record_from_row,
    text_column,
)
from idempotency_async.stores.base import CLAIMED, Extended, Verdict, Written, judge

__all__ = ["TransactionStore", "bind"]

_FROM_SNAPSHOT: Final = 2  # the transactional claim's last column: where the answer came from
_NOT_IN_TRANSACTION: Final = (
    "execute_in_transaction needs a connection in a transaction that the caller commits: "
    "`async with connection.transaction():` (asyncpg, psycopg) or `async with "
    "session.begin():` (SQLAlchemy), then call it inside that block"
)


class _Connection(Protocol):
    async def fetchrow(self, sql: str, *args: Any) -> Any: ...

    async def script(self, sql: str) -> None: ...


class _Asyncpg:
    """A caller's asyncpg connection (or a pool's connection proxy)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        return await self._connection.fetchrow(sql, *args)

    async def script(self, sql: str) -> None:
        await self._connection.execute(sql)  # no arguments: the simple protocol


async def bind(connection: Any, sql: Statements, table: str, limit: int) -> TransactionStore:
    """The store's operations on ``connection``, checked to be in a transaction before any
    statement (``ConfigError`` otherwise)."""
    module = type(connection).__module__
    if module.startswith("sqlalchemy"):
        if not connection.in_transaction():
            raise ConfigError(_NOT_IN_TRANSACTION)
        session = None if hasattr(connection, "get_raw_connection") else _Session(connection)
        driver = await _sqlalchemy_driver(connection)
        return TransactionStore(driver, sql, table, limit, session)
    if is_psycopg_connection(connection):
        psycopg = PsycopgConnection(connection)
        if not psycopg.in_transaction():
            raise ConfigError(_NOT_IN_TRANSACTION)
        return TransactionStore(psycopg, sql, table, limit)
    if callable(getattr(connection, "is_in_transaction", None)) and callable(
        getattr(connection, "fetchrow", None)
    ):
        if not connection.is_in_transaction():
            raise ConfigError(_NOT_IN_TRANSACTION)
        return TransactionStore(_Asyncpg(connection), sql, table, limit)
    raise ConfigError(
        "execute_in_transaction takes the caller's connection: an asyncpg Connection, a "
        "psycopg AsyncConnection, or a SQLAlchemy AsyncConnection or AsyncSession; got "
        f"{type(connection).__name__} (a pool cannot hold a transaction: acquire a "
        "connection from it)"
    )


async def _sqlalchemy_driver(connection: Any) -> _Connection:
    """The driver connection under a SQLAlchemy ``AsyncConnection`` or ``AsyncSession``
    in a transaction (checked by :func:`bind`).  Never flushes, commits or closes anything
    of the caller's."""
    if hasattr(connection, "get_raw_connection"):
        core = connection
    else:  # an AsyncSession: its connection for the transaction it is in
        core = await connection.connection()
    driver = (await core.get_raw_connection()).driver_connection
    if is_psycopg_connection(driver):
        # SQLAlchemy keeps psycopg out of autocommit: psycopg opens the transaction with the
        # first statement, and SQLAlchemy commits it.
        psycopg = PsycopgConnection(driver)
        if not psycopg.in_transaction(implicit=True):
            raise ConfigError(_NOT_IN_TRANSACTION)
        return psycopg
    if not callable(getattr(driver, "is_in_transaction", None)):
        raise ConfigError(
            "execute_in_transaction supports SQLAlchemy on the asyncpg or psycopg drivers; "
            f"this engine's driver connection is {type(driver).__name__}"
        )
    if not driver.is_in_transaction():
        # SQLAlchemy's asyncpg adapter sends BEGIN with the transaction's first statement:
        # send one through it, so that ours run in the transaction it will commit.
        await core.exec_driver_sql("SELECT 1")
    return _Asyncpg(driver)


class _Session:
    """A caller's SQLAlchemy ``AsyncSession``.  When the savepoint rolls back, the session
    must forget what the callback did there, as SQLAlchemy's own nested transactions make
    it forget — without flushing anything: objects the callback added (flushed or not),
    loaded or deleted are expunged, and the others expired (reloaded when next read).  The
    session had nothing unflushed when the call began (see :func:`bind`)."""

    def __init__(self, session: Any) -> None:
        if session.new or session.dirty or session.deleted:
            raise ConfigError(
                "execute_in_transaction needs a session without unflushed changes: a flush "
                "inside the call (yours, or an autoflush before a query) would write them in "
                "the call's savepoint, and a failing callback would roll them back with it. "
                "`await session.flush()` before the call"
            )
        self._session = session
        self._known: set[int] = set()

    def remember(self) -> None:
        """The objects in the session as the callback starts (by identity: mapped objects
        need not be hashable)."""
        self._known = {id(o) for o in self._session.identity_map.values()}

    def forget_callback(self) -> None:
        session = self._session
        for obj in (*session.new, *session.deleted):
            session.expunge(obj)
        for obj in list(session.identity_map.values()):
            if id(obj) in self._known:
                session.expire(obj)
            else:
                session.expunge(obj)


class TransactionStore:
    """The record store's operations on a caller's connection, in its transaction.

    A claim opens the savepoint and the lock-wait bound, and leaves the savepoint open only
    when it claimed; :meth:`complete` releases it, :meth:`release` rolls it back.
    """

    db_system_name: Final = "postgresql"

    def __init__(
        self,
        connection: _Connection,
        sql: Statements,
        table: str,
        limit: int,
        session: _Session | None = None,
    ) -> None:
        self._connection = connection
        self._session = session
        self._sql = sql
        self.table = table
        self.max_response_bytes = limit

    @property
    def table_name(self) -> str:
        return self.table

    async def claim_within(self, claim: Claim, wait: float) -> Verdict:
        """Claim the key, waiting at most ``wait`` seconds for a row another open
        transaction holds (then :class:`LockTimeoutError`)."""
        key = claim.key
        await self._script("claim", key, SAVEPOINT_BEGIN)
        try:
            row = await self._fetchrow(
                "claim",
                key,
                self._sql.transactional_claim,
                key,
                None,  # the server's clock_timestamp(), always
                claim.owner,
                float(claim.lease),
                float(claim.ttl),
                claim.validation,
                lock_wait(wait),
            )
            verdict = claim_verdict(claim, row, self.max_response_bytes)
        except Exception as exc:
            await self._undo(exc)
            raise
        if verdict is CLAIMED and self._session is not None:
            self._session.remember()
        if verdict is not CLAIMED:
            # Nothing to keep.  An answer read from the statement's snapshot wrote nothing:
            # releasing the savepoint is enough, and keeps psycopg's prepared statements
            # (it drops them all after any ROLLBACK).  Otherwise the claim locked (and
            # rewrote) a row committed while it waited: roll that back.
            undo = SAVEPOINT_RELEASE if row[9] == _FROM_SNAPSHOT else SAVEPOINT_UNDO
            await self._script("claim", key, undo)
        return verdict

    async def claim(self, claim: Claim) -> Verdict:
        return await self.claim_within(claim, 0.0)

    async def get(self, key: str, *, now: float) -> Verdict:
        row = await self._fetchrow("get", key, self._sql.get, key, None)
        if row[0] is None:
            return judge(None, row[7])
        return judge(record_from_row(key, row, self.max_response_bytes), row[7])

    async def complete(self, completion: Completion) -> Written:
        """The owner-conditioned completion in the savepoint, then its release.  A failure
        leaves the caller's transaction aborted: it can only roll back (nothing commits)."""
        key = completion.key
        text, reason = completion_text(completion, self.max_response_bytes)
        row = await self._fetchrow(
            "complete",
            key,
            self._sql.complete,
            key,
            completion.owner,
            None,
            float(completion.ttl),
            completion.validation,
            text,
            None if text is not None else text_column(reason),
        )
        await self._script("complete", key, SAVEPOINT_RELEASE)
        if row is None:
            return Written.NOTHING
        return Written.WITHOUT_RESPONSE if text is None else Written.RESPONSE

    async def release(self, key: str, owner: str) -> bool:
        """Roll the savepoint back: the claim and the callback's writes go, and whoever
        waits on the row gets it."""
        await self._script("release", key, SAVEPOINT_UNDO)
        if self._session is not None:
            self._session.forget_callback()
        return True

    async def extend(self, claim: Claim) -> Extended:
        # The row lock holds the key until the transaction ends: no lease to move.
        return Extended.RENEWED

    async def force_release(self, key: str) -> Record | None:
        raise ConfigError("force_release is not part of a transactional call")

    async def aclose(self) -> None:
        return None

    async def _undo(self, error: BaseException) -> None:
        """Roll the savepoint back after a failed claim; a failure becomes a note on
        ``error`` (the connection is then unusable, and so is the caller's transaction)."""
        try:
            await self._connection.script(SAVEPOINT_UNDO)
        except Exception as exc:
            error.add_note(
                f"idempotency-async: rolling back its savepoint failed ({exc!r}): roll the "
                "transaction back"
            )

    async def _fetchrow(self, operation: str, key: str, sql: str, *args: Any) -> Any:
        try:
            return await self._connection.fetchrow(sql, *args)
        except Exception as exc:
            error = self._error(exc, operation, key)
            if error is exc:
                raise
            raise error from exc

    async def _script(self, operation: str, key: str, sql: str) -> None:
        try:
            await self._connection.script(sql)
        except Exception as exc:
            error = self._error(exc, operation, key)
            if error is exc:
                raise
            raise error from exc

    def _error(self, exc: Exception, operation: str, key: str) -> Exception:
        state = getattr(exc, "sqlstate", None)
        if state == "55P03":
            return LockTimeoutError(
                f"key {key} is held by another open transaction, which did not end within "
                "this call's wait (Options(wait=..., wait_timeout=...) or its deadline); only "
                "this call's savepoint was rolled back: retry later",
                key=key,
            )
        if state == "40001":
            return SerializationFailureError(
                f"the {operation} of key {key} could not be serialized with a concurrent "
                "transaction (under REPEATABLE READ or SERIALIZABLE: e.g. a duplicate committed "
                "the record after this transaction's snapshot): roll the transaction back and "
                "run it again; under READ COMMITTED a duplicate replays instead",
                key=key,
                sqlstate=state,
            )
        if state == "40P01":
            return DeadlockDetectedError(
                f"PostgreSQL broke a deadlock by failing this transaction's {operation} of "
                f"key {key}: roll the transaction back and run it again",
                key=key,
                sqlstate=state,
            )
        return translated(exc, f"transactional {operation}", key, self.table)
