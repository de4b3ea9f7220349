"""A caller's connection for a transactional call: which drivers, and checked before any
statement.

``Manager.execute_in_transaction`` takes the connection the caller's transaction is on:
asyncpg's (or a pool's connection proxy), psycopg 3's ``AsyncConnection``, or SQLAlchemy's
``AsyncConnection`` / ``AsyncSession`` (asyncpg or psycopg driver underneath).  Anything
else — a pool, an engine, a connection not in a transaction, a session whose writes could
go to another database — is ``ConfigError`` here, before any statement: the record and the
callback's writes must be one transaction.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias

from idempotency_async.errors import ConfigError
from idempotency_async.stores._postgres_psycopg import PsycopgConnection, is_psycopg_connection

__all__ = ["AsyncpgConnection", "Driver", "Session", "TransactionConnection", "driver_of"]


class AsyncpgConnection(Protocol):
    """What an asyncpg ``Connection`` (or a pool's connection proxy) offers a transactional
    call (asyncpg ships no types: this keeps an engine or a pool from type-checking as a
    connection)."""

    def is_in_transaction(self) -> bool: ...

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Any: ...


if TYPE_CHECKING:
    from psycopg import AsyncConnection as _PsycopgAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncConnection as _SqlAlchemyConnection
    from sqlalchemy.ext.asyncio import AsyncSession as _SqlAlchemySession

    TransactionConnection: TypeAlias = (
        AsyncpgConnection
        | _PsycopgAsyncConnection[Any]
        | _SqlAlchemyConnection
        | _SqlAlchemySession
    )
else:
    TransactionConnection = Any
"""The connection a transactional call runs on: asyncpg's ``Connection`` (or a pool's
connection proxy), psycopg 3's ``AsyncConnection``, or SQLAlchemy's ``AsyncConnection`` or
``AsyncSession`` — in a transaction the caller commits."""

_NOT_IN_TRANSACTION: Final = (
    "execute_in_transaction needs a connection in a transaction that the caller commits: "
    "`async with connection.transaction():` (asyncpg, psycopg) or `async with "
    "session.begin():` (SQLAlchemy), then call it inside that block"
)
_NOT_A_CONNECTION: Final = (
    "execute_in_transaction takes the connection your transaction is on: an asyncpg "
    "Connection, a psycopg AsyncConnection, or a SQLAlchemy AsyncConnection or AsyncSession"
)


class Driver(Protocol):
    """A caller's connection, as a transactional call uses it."""

    async def fetchrow(self, sql: str, *args: Any, timeout: float | None = None) -> Any: ...

    async def script(self, sql: str, *, timeout: float | None = None) -> None:
        """Statements without parameters, in one round trip (the simple protocol)."""
        ...

    def in_transaction(self) -> bool:
        """Whether the caller's transaction is still open (possibly aborted), as the client
        last heard: no round trip."""
        ...


class _Asyncpg:
    """A caller's asyncpg connection (or a pool's connection proxy)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    async def fetchrow(self, sql: str, *args: Any, timeout: float | None = None) -> Any:
        # asyncpg cancels the statement on the server when the timeout fires.
        return await self._connection.fetchrow(sql, *args, timeout=timeout)

    async def script(self, sql: str, *, timeout: float | None = None) -> None:
        await self._connection.execute(sql, timeout=timeout)  # no arguments: simple protocol

    def in_transaction(self) -> bool:
        return bool(self._connection.is_in_transaction())


class _Psycopg:
    """A caller's psycopg ``AsyncConnection``."""

    def __init__(self, connection: Any) -> None:
        self._connection = PsycopgConnection(connection)

    async def fetchrow(self, sql: str, *args: Any, timeout: float | None = None) -> Any:
        if timeout is None:
            return await self._connection.fetchrow(sql, *args)
        # psycopg cancels the statement on the server when its task is cancelled.
        async with asyncio.timeout(timeout):
            return await self._connection.fetchrow(sql, *args)

    async def script(self, sql: str, *, timeout: float | None = None) -> None:
        if timeout is None:
            await self._connection.script(sql)
            return
        async with asyncio.timeout(timeout):
            await self._connection.script(sql)

    def in_transaction(self) -> bool:
        return self._connection.in_transaction(aborted=True)


class Session:
    """A caller's SQLAlchemy ``AsyncSession``.  When the call's savepoint rolls back, the
    session must forget what the callback did there, as SQLAlchemy's own nested
    transactions make it forget — without flushing anything: objects the callback added
    (flushed or not), loaded or deleted are expunged, and the others expired (reloaded when
    next read).  The session had nothing unflushed when the call began."""

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


async def driver_of(connection: Any) -> tuple[Driver, Session | None]:
    """The driver connection a transactional call runs on, checked to be in a transaction
    (and for a session: one database, nothing unflushed) before any statement."""
    module = type(connection).__module__
    if module.startswith("sqlalchemy"):
        return await _sqlalchemy(connection)
    if is_psycopg_connection(connection):
        psycopg = _Psycopg(connection)
        if not PsycopgConnection(connection).in_transaction():
            raise ConfigError(_NOT_IN_TRANSACTION)
        return psycopg, None
    if callable(getattr(connection, "is_in_transaction", None)) and callable(
        getattr(connection, "fetchrow", None)
    ):
        if not connection.is_in_transaction():
            raise ConfigError(_NOT_IN_TRANSACTION)
        return _Asyncpg(connection), None
    raise ConfigError(
        f"{_NOT_A_CONNECTION}; got {type(connection).__name__} (a pool or an engine cannot hold "
        "a transaction: acquire a connection from it, or open a session)"
    )


async def _sqlalchemy(connection: Any) -> tuple[Driver, Session | None]:
    """The driver connection under a SQLAlchemy ``AsyncConnection`` or ``AsyncSession`` in
    a transaction.  Never flushes, commits or closes anything of the caller's."""
    name = type(connection).__name__
    if name == "AsyncConnection" and hasattr(connection, "get_raw_connection"):
        core, session = connection, None
        if not connection.in_transaction():
            raise ConfigError(_NOT_IN_TRANSACTION)
    elif name == "AsyncSession" and hasattr(connection, "sync_session"):
        if not connection.in_transaction():
            raise ConfigError(_NOT_IN_TRANSACTION)
        engine = _one_engine(connection)
        session = Session(connection)
        core = await connection.connection(bind_arguments={"bind": engine})
    else:
        raise ConfigError(
            f"{_NOT_A_CONNECTION}; got SQLAlchemy's {name} (an engine or a sessionmaker "
            "cannot hold a transaction: `async with engine.begin() as connection:` or "
            "`async with Session() as session, session.begin():`)"
        )
    driver = (await core.get_raw_connection()).driver_connection
    if is_psycopg_connection(driver):
        # SQLAlchemy keeps psycopg out of autocommit: psycopg opens the transaction with the
        # first statement, and SQLAlchemy commits it.
        if not PsycopgConnection(driver).in_transaction(implicit=True):
            raise ConfigError(_NOT_IN_TRANSACTION)
        return _Psycopg(driver), session
    if not callable(getattr(driver, "is_in_transaction", None)):
        raise ConfigError(
            "execute_in_transaction supports SQLAlchemy on the asyncpg or psycopg drivers; "
            f"this engine's driver connection is {type(driver).__name__}"
        )
    if not driver.is_in_transaction():
        # SQLAlchemy's asyncpg adapter sends BEGIN with the transaction's first statement:
        # send one through it, so that ours run in the transaction it will commit.
        await core.exec_driver_sql("SELECT 1")
    return _Asyncpg(driver), session


def _one_engine(session: Any) -> Any:
    """The one engine an ``AsyncSession`` writes to.  Sessions bound to several engines (or
    to none by default) would write the record in one transaction and the callback's rows
    in another: one could commit without the other."""
    sync = session.sync_session
    binds = [sync.bind] if sync.bind is not None else []
    binds += list(getattr(sync, "binds", {}).values())
    engines = {id(_engine(bind)): _engine(bind) for bind in binds}
    if len(engines) == 1:
        return binds[0]
    if not engines:
        raise ConfigError(
            "execute_in_transaction needs a session bound to one engine (AsyncSession(engine) "
            "or sessionmaker(bind=engine)); this one has no bind"
        )
    raise ConfigError(
        f"execute_in_transaction needs a session bound to one engine; this one has "
        f"{len(engines)} (Session(binds=...)): the idempotency record would commit in one "
        "engine's transaction and the callback's writes in another's, so one could commit "
        "without the other. Use a session of the engine whose database holds the record "
        "table, for the writes that must be exactly once"
    )


def _engine(bind: Any) -> Any:
    """The engine of a session bind (an Engine, or a Connection of one)."""
    return getattr(bind, "engine", bind)
