"""Translation of redis-py / valkey-py failures into the library's PersistenceError family.

The two clients raise parallel exception trees (``redis.exceptions`` and
``valkey.exceptions``) with the same class names, so failures are recognised by the names
in their class hierarchy: the store works with either client without importing both.
Not every client exception is a ``RedisError``: the cluster client's
``RedisClusterException`` (and ``SlotNotCoveredError``, raised when no node answers)
derive from ``Exception`` alone, so anything raised from the client's own packages counts
as a client failure too.  And not every failure is a client exception at all: redis-py's
cluster client can fail a command with a bare ``AttributeError`` while it reloads its
slot map (a connection closed under a command).  Whatever a call to the client raises is
a store error: ``StoreUnavailableError`` (outcome unknown) when nothing more specific
applies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

from idempotency_async.errors import (
    IdempotencyError,
    PersistenceError,
    StoreAccessDeniedError,
    StoreUnavailableError,
    StoreValidationError,
)

__all__ = ["is_client_defect", "is_no_script", "translate_errors", "translated"]

_DENIED: Final = frozenset({"AuthenticationError", "AuthorizationError", "NoPermissionError"})
_UNAVAILABLE: Final = frozenset(
    {
        "ConnectionError",
        "TimeoutError",
        "BusyLoadingError",
        "ReadOnlyError",
        "ClusterDownError",
        "ClusterError",
        "TryAgainError",
        "MasterDownError",
        "MasterNotFoundError",
        "SlaveNotFoundError",
        "MaxConnectionsError",
        "OutOfMemoryError",
        "RedisClusterException",
        "ValkeyClusterException",
        "SlotNotCoveredError",
    }
)
_CLIENT_ERRORS: Final = frozenset({"RedisError", "ValkeyError"})
_CLIENT_PACKAGES: Final = frozenset({"redis", "valkey"})


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _from_client(exc: BaseException) -> bool:
    """Whether ``exc`` is a Redis client exception: a ``RedisError`` / ``ValkeyError``, or
    any class defined in the client's packages (the cluster exceptions are neither)."""
    return any(cls.__module__.partition(".")[0] in _CLIENT_PACKAGES for cls in type(exc).__mro__)


def is_client_defect(exc: BaseException) -> bool:
    """Whether the client failed with an exception that is not one of its own (a defect,
    such as redis-py's ``'NoneType' object has no attribute 'writelines'`` while a cluster
    client reloads its slot map): the command may be sent again on a fresh connection."""
    return not isinstance(exc, IdempotencyError) and not _from_client(exc)


def is_no_script(exc: BaseException) -> bool:
    """Whether the server lost the script (restart, failover, ``SCRIPT FLUSH``)."""
    return "NoScriptError" in _names(exc)


@contextlib.contextmanager
def translate_errors(operation: str, key: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        raise translated(exc, operation, key) from exc


def translated(exc: Exception, operation: str, key: str) -> Exception:
    """The library's error for ``exc``, raised by a call to the client (``exc`` itself
    when it is already one of the library's errors).

    Raise it ``from exc``; the hot paths call this from an ``except`` block rather than
    entering :func:`translate_errors`, whose generator costs a few µs per use.
    """
    if isinstance(exc, IdempotencyError):
        return exc
    translated = _translate(exc, operation, key)
    if translated is not None:
        return translated
    where = f"Redis {operation}" + (f" of key {key!r}" if key else "")
    return StoreUnavailableError(
        f"{where} failed inside the Redis client ({type(exc).__name__}: {exc}); the outcome "
        "is unknown: retry (a cluster client reloading its slot map, e.g. while slots "
        "migrate, fails commands this way)"
    )


def _translate(exc: Exception, operation: str, key: str) -> PersistenceError | None:
    names = _names(exc)
    where = f"Redis {operation}" + (f" of key {key!r}" if key else "")
    if names & _DENIED:
        return StoreAccessDeniedError(
            f"{where} was refused ({exc}): check the user name, password and ACL of the URL or "
            "client; the store runs EVALSHA, SCRIPT LOAD, GET, SET, DEL, TIME (and WAIT)"
        )
    text = str(exc)
    if "WRONGTYPE" in text:
        return StoreValidationError(
            f"{where} failed: the key holds a value that is not a string ({exc}); another "
            "application uses this key name: give the store a key_prefix of its own"
        )
    if text.startswith("OOM") or "OutOfMemoryError" in names:
        return StoreUnavailableError(
            f"{where} failed: the server is out of memory ({exc}); raise maxmemory or shorten "
            "expires_after (with the recommended noeviction policy, claims are refused "
            "rather than records evicted)"
        )
    if names & _UNAVAILABLE or isinstance(exc, OSError | TimeoutError):
        return StoreUnavailableError(
            f"{where} failed: the server did not answer ({type(exc).__name__}: {exc})"
        )
    if names & _CLIENT_ERRORS or _from_client(exc):
        return StoreUnavailableError(f"{where} failed ({type(exc).__name__}: {exc})")
    return None
