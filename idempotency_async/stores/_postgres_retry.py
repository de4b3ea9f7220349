"""Running a whole transaction again when PostgreSQL fails it to keep it serializable.

Under REPEATABLE READ or SERIALIZABLE (and on a deadlock at any level) PostgreSQL resolves
a conflict between concurrent transactions by failing one of them; the remedy is to roll
it back and run all of it again, with a new snapshot.  :func:`retry_transaction` is that
loop, for the connections ``Manager.execute_in_transaction`` takes; :func:`is_refused_commit`
recognises the other COMMIT failure transactional calls bring — the table's guard refusing
a transaction that holds an unfinished claim (never worth a retry as it is: fix the code
that committed).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final, Literal, TypeVar

from idempotency_async.errors import ConfigError, TransactionRetryError
from idempotency_async.stores._postgres_psycopg import is_psycopg_connection
from idempotency_async.stores._postgres_schema import REFUSED_COMMIT

__all__ = ["Isolation", "is_refused_commit", "retry_transaction", "retryable"]

C = TypeVar("C")
T = TypeVar("T")

Isolation = Literal["read_committed", "repeatable_read", "serializable"]
_LEVELS: Final = {
    "read_committed": "READ COMMITTED",
    "repeatable_read": "REPEATABLE READ",
    "serializable": "SERIALIZABLE",
}
_RETRYABLE: Final = frozenset({"40001", "40P01"})  # serialization failure, deadlock
_DEPTH: Final = 8  # how far along the chain of causes (SQLAlchemy wraps the driver's)


async def retry_transaction(
    connection: C,
    work: Callable[[C], Awaitable[T]],
    *,
    attempts: int = 5,
    isolation: Isolation | None = None,
    first_delay: float = 0.05,
    max_delay: float = 1.0,
) -> T:
    """Run ``await work(connection)`` in a transaction on ``connection`` and commit it;
    when the transaction fails with a serialization failure or a deadlock — a
    :class:`~idempotency_async.errors.TransactionRetryError` from a transactional call, or
    SQLSTATE 40001 / 40P01 from any statement or the COMMIT — roll it back and run it all
    again, at most ``attempts`` times in all.  Returns what the committed run of ``work``
    returned; the last failure propagates, and any other exception at once.

    ``connection``: an asyncpg ``Connection`` (or a pool's), a psycopg 3 ``AsyncConnection``,
    or a SQLAlchemy ``AsyncConnection`` / ``AsyncSession`` — not in a transaction yet: each
    attempt opens its own (``connection.transaction()``, ``session.begin()``).
    ``isolation`` (``"repeatable_read"``, ``"serializable"``, ``"read_committed"``; default:
    the connection's) is set at the start of every attempt.  Between attempts it sleeps a
    random delay up to ``first_delay`` * 2 ** (attempt - 1), capped at ``max_delay`` (full
    jitter: concurrent losers spread out instead of colliding again).

    ``work`` must be safe to run again: everything it does through ``connection`` is rolled
    back with a failed attempt, anything else (an HTTP call, a message) is not.
    """
    _check(attempts, isolation, first_delay, max_delay)
    for attempt in range(1, attempts + 1):
        try:
            return await _attempt(connection, work, isolation)
        except Exception as exc:
            if attempt == attempts or not retryable(exc):
                raise
        bound = min(max_delay, first_delay * 2 ** (attempt - 1))
        await asyncio.sleep(random.uniform(0.0, bound))
    raise AssertionError("unreachable: the last attempt returns or raises")


async def _attempt(
    connection: Any, work: Callable[[Any], Awaitable[T]], isolation: str | None
) -> T:
    module = type(connection).__module__
    level = None if isolation is None else _LEVELS[isolation]
    if module.startswith("sqlalchemy"):
        async with connection.begin():
            if level is not None:
                core = (
                    connection
                    if hasattr(connection, "exec_driver_sql")
                    else await connection.connection()
                )
                await core.exec_driver_sql(f"SET TRANSACTION ISOLATION LEVEL {level}")
            return await work(connection)
    if is_psycopg_connection(connection):
        async with connection.transaction():
            if level is not None:
                await connection.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            return await work(connection)
    if callable(getattr(connection, "transaction", None)) and callable(
        getattr(connection, "is_in_transaction", None)
    ):
        async with connection.transaction(isolation=isolation):
            return await work(connection)
    raise ConfigError(
        "retry_transaction takes a connection it can open transactions on: an asyncpg "
        "Connection, a psycopg AsyncConnection, or a SQLAlchemy AsyncConnection or "
        f"AsyncSession; got {type(connection).__name__}"
    )


def retryable(exc: BaseException) -> bool:
    """Whether ``exc`` says to run the whole transaction again: a
    :class:`~idempotency_async.errors.TransactionRetryError`, or a driver's error (or
    SQLAlchemy's around it) with SQLSTATE 40001 (serialization failure) or 40P01
    (deadlock)."""
    return any(
        isinstance(error, TransactionRetryError) or _sqlstate(error) in _RETRYABLE
        for error in _chain(exc)
    )


def is_refused_commit(exc: BaseException) -> bool:
    """Whether ``exc`` is a COMMIT the table's guard refused (SQLSTATE ``IA001``): the
    transaction held a transactional call's claim that never finished — the caller
    committed after a handled timeout or cancellation, or the callback committed — so
    nothing of it was committed.  Accepts the driver's error or SQLAlchemy's around it."""
    return any(_sqlstate(error) == REFUSED_COMMIT for error in _chain(exc))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, what it wraps (SQLAlchemy's ``orig``), and its causes."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending and len(seen) < _DEPTH:
        error = pending.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        for inner in (getattr(error, "orig", None), error.__cause__, error.__context__):
            if isinstance(inner, BaseException):
                pending.append(inner)


def _sqlstate(error: BaseException) -> str | None:
    state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    return state if isinstance(state, str) else None


def _check(attempts: int, isolation: str | None, first_delay: float, max_delay: float) -> None:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigError(f"attempts must be an integer >= 1, got {attempts!r}")
    if isolation is not None and isolation not in _LEVELS:
        raise ConfigError(
            f"isolation must be one of {', '.join(sorted(_LEVELS))} (or None), got {isolation!r}"
        )
    for name, value in (("first_delay", first_delay), ("max_delay", max_delay)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value < math.inf
        ):
            raise ConfigError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
