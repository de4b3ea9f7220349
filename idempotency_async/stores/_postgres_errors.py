"""Translation of asyncpg failures into the library's PersistenceError family.

Server errors are recognised by their SQLSTATE (``exc.sqlstate``), client failures by the
names in their class hierarchy, so this module never imports asyncpg (an optional extra).
"""

from __future__ import annotations

from typing import Final

from idempotency_async.errors import (
    IdempotencyError,
    LockTimeoutError,
    StoreAccessDeniedError,
    StoreUnavailableError,
    StoreValidationError,
)

__all__ = ["is_data_error", "translated"]

# 08 connection exception, 53 insufficient resources, 57 operator intervention (shutdown,
# starting up, statement timeout), 40 serialization failure / deadlock, 55P03 lock timeout,
# 25006 read-only transaction (a standby), 58 system error.
_UNAVAILABLE_CLASSES: Final = ("08", "53", "57", "40", "58")
_UNAVAILABLE_STATES: Final = frozenset({"55P03", "25006"})
_DENIED_CLASSES: Final = ("28",)
_DENIED_STATES: Final = frozenset({"42501"})
_MISSING_STATES: Final = frozenset({"42P01", "42703", "3F000"})
# asyncpg's, then psycopg's (OperationalError: no connection; the pool's timeouts).
_CLIENT_FAILURES: Final = frozenset(
    {
        "InterfaceError",
        "InternalClientError",
        "ConnectionDoesNotExistError",
        "ClientConfigurationError",
        "OperationalError",
        "PoolTimeout",
        "PoolClosed",
    }
)


def is_data_error(exc: BaseException) -> bool:
    """Whether the server refused a value (SQLSTATE class 22: e.g. what jsonb cannot hold)."""
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state.startswith("22")


def translated(exc: Exception, operation: str, key: str, table: str) -> Exception:
    """The library's error for ``exc`` (``exc`` itself when it is not a driver failure): a
    ``PersistenceError``, or for a claim that waited too long for a row lock
    ``LockTimeoutError``.

    Raise it ``from exc``.
    """
    if isinstance(exc, IdempotencyError):
        return exc
    where = f"Postgres {operation}" + (f" of key {key!r}" if key else "")
    state = getattr(exc, "sqlstate", None)
    if isinstance(state, str):
        if state in _MISSING_STATES:
            return StoreValidationError(
                f"{where} failed: {exc} — the table {table} is missing or has other columns; "
                "create it with create_table() or `idempotency-async create-table "
                "postgres://…`, or bring a table made by an earlier version to the current "
                "schema with `idempotency-async migrate` (docs/postgres.md)"
            )
        if state.startswith(_DENIED_CLASSES) or state in _DENIED_STATES:
            return StoreAccessDeniedError(
                f"{where} was refused ({exc}): check the user and password of the DSN, and "
                f"that the user may SELECT, INSERT, UPDATE and DELETE on {table}"
            )
        if state == "55P03" and operation == "claim":
            return LockTimeoutError(
                f"key {key} is held by an open transactional call (execute_in_transaction), "
                "whose transaction did not end before this call's lease would have: retry "
                "later",
                key=key,
            )
        if state == "55P03":
            return StoreUnavailableError(
                f"{where} waited too long for the record's row: an open transaction (a "
                "transactional call) holds it; try again once that transaction has ended"
            )
        if state.startswith(_UNAVAILABLE_CLASSES) or state in _UNAVAILABLE_STATES:
            return StoreUnavailableError(f"{where} failed: {type(exc).__name__}: {exc}")
        return StoreUnavailableError(f"{where} failed ({state} {type(exc).__name__}: {exc})")
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _CLIENT_FAILURES or isinstance(exc, OSError | TimeoutError):
        return StoreUnavailableError(
            f"{where} failed: the server did not answer ({type(exc).__name__}: {exc})"
        )
    return exc
