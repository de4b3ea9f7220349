"""The Manager: runs a callback at most once per idempotency key and replays its result.

A manager only wires: it derives the key (``_keys``) and the call's deadline (``_lease``)
and hands the call to its lifecycle (``_lifecycle``), which claims, holds, runs, completes
or releases.  Each door is a few lines into :meth:`Lifecycle.run` (or, for
:meth:`Manager.replay`, the lifecycle's read path).  What telemetry needs is chosen when
the manager is built: the store's timing wrapper, and a synchronous span scope around each
call; without telemetry neither is there.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from idempotency_async._call import Call, Unprotected
from idempotency_async._disabled import disabled_by_environment
from idempotency_async._emission import Emitter
from idempotency_async._keys import Keys, key_deriver
from idempotency_async._lease import effective_deadline
from idempotency_async._lifecycle import Lifecycle
from idempotency_async._replayed import declared_errors
from idempotency_async.errors import ConfigError
from idempotency_async.events import EventKind
from idempotency_async.instrumentation import Observer
from idempotency_async.options import Options
from idempotency_async.record import Record
from idempotency_async.stores.base import RecordsSteps, Store

if TYPE_CHECKING:
    from idempotency_async.stores.postgres import TransactionConnection

__all__ = ["KeyedPayload", "Manager"]

T = TypeVar("T")

_log = logging.getLogger("idempotency_async")


class _Untraced:
    """The span scope of a manager without telemetry: one object, doing nothing."""

    __slots__ = ()

    def __call__(self) -> _Untraced:
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None


_UNTRACED = _Untraced()


class Manager:
    """Runs each key's work at most once while its record lives, and replays the result.

    A crash is covered up to the lease: a process that dies after the work's effect and
    before completing the record leaves the key in progress until its lease (the call's
    deadline, or a renewed short lease) ends; a retry then runs the work again.
    :meth:`execute_in_transaction` makes database effects exactly once; downstream keys
    carry the key to providers (``docs/choose.md``).

    A manager snapshots its :class:`Options`, owns its local cache and its in-flight
    table; several managers may share one store with distinct key prefixes.
    """

    def __init__(self, store: Store, options: Options | None = None) -> None:
        self.store = store
        self.options = options if options is not None else Options()
        _check_record_format(store, self.options)
        self._keys = key_deriver(self.options)
        self._disabled = disabled_by_environment()
        telemetry = self.options.telemetry
        observer = None if telemetry is None else telemetry.bind(self._keys.prefix, store)
        self._observer = observer
        # Chosen once: the store round trips go to (timed with telemetry), each call's
        # span scope and the door calls enter by (through the span with telemetry).
        self._span: Callable[[], AbstractContextManager[None]] = (
            _UNTRACED if observer is None else observer.span
        )
        self._enter = self._door if observer is None else self._observed
        self._lifecycle = Lifecycle(
            store if observer is None else observer.store,
            self.options,
            self._keys,
            Emitter(self.options, observer),
            records_steps=isinstance(store, RecordsSteps),
        )
        if self._disabled:
            _log.warning(
                "idempotency is disabled by POWERTOOLS_IDEMPOTENCY_DISABLED: "
                "callbacks run on every call",
                extra={"idempotency_prefix": self._keys.prefix},
            )

    @property
    def key_prefix(self) -> str:
        return self._keys.prefix

    @property
    def observer(self) -> Observer | None:
        """The telemetry observer bound to this manager (None without telemetry)."""
        return self._observer

    @property
    def _store(self) -> Store:
        """The store round trips go to: the observer's timing wrapper with telemetry."""
        return self._lifecycle.store

    # ------------------------------------------------------------------ public API

    def key_for(self, payload: Any) -> str | None:
        """The key :meth:`execute` would use for ``payload``, or None when it selects no key."""
        keys = self._keys.derive(payload)
        return None if keys is None else keys.key

    def execute(
        self,
        payload: Any,
        callback: Callable[[], Awaitable[T]],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, T]:
        """Run ``callback`` once for this payload's key, or replay the stored result.

        ``result = await manager.execute(order, lambda: charge(order))``.  ``timeout``
        (seconds from this call) and ``deadline`` (``loop.time()`` units) bound the call;
        with the ambient :func:`~idempotency_async.deadline`, the earliest wins and becomes
        the record's lease.  Cancellation propagates and leaves no store write behind.

        The deadline is taken and the key derived when ``execute`` is called; what it
        refuses is raised when the coroutine it returns is awaited.
        """
        # A plain function handing back the lifecycle's coroutine: a call in flight holds
        # one coroutine frame, not two (see _door).
        return self._enter(payload, callback, deadline, timeout, False)

    def execute_call(
        self,
        payload: Any,
        callback: Callable[[Call], Awaitable[T]],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, T]:
        """As :meth:`execute`, for work that knows its answer before it has finished.

        ``callback(call)`` may complete the record while it goes on running, with
        ``await call.complete(result)`` (or ``call.complete_without_response(reason)``):
        that is its point of no return.  Up to it, the call is what ``execute`` is (cut off
        at the deadline, released if the callback raises).  After it, the deadline no longer
        applies and nothing the callback does can release the key: a later exception or
        cancellation propagates with the record completed.  A callback that returns without
        completing is completed with its return value, as with ``execute``; one that called
        ``call.release(reason)`` is released instead.  Returns the callback's return value,
        or the replay of the stored result.
        """
        return self._enter(payload, callback, deadline, timeout, True)

    if hasattr(inspect, "markcoroutinefunction"):  # Python 3.12+
        # Callers (and frameworks) that ask see what they get back: a coroutine to await.
        execute = inspect.markcoroutinefunction(execute)
        execute_call = inspect.markcoroutinefunction(execute_call)

    def _door(
        self,
        payload: Any,
        callback: Callable[..., Awaitable[T]],
        deadline: float | None,
        timeout: float | None,
        held: bool,
    ) -> Coroutine[Any, Any, T]:
        """The call into the lifecycle, for :meth:`execute` (``held`` False) and
        :meth:`execute_call`: a plain function handing back the lifecycle's coroutine, so
        the door costs the call no frame of its own (with thousands of calls in flight,
        each frame is memory and garbage-collector work).  What it refuses is raised when
        the coroutine is awaited; the store is not touched before that."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # asyncio.run(manager.execute(...)): the loop starts later
            return self._in_loop(payload, callback, deadline, timeout, held)
        try:
            if not callable(callback):
                raise _not_callable(callback, held)
            when = effective_deadline(loop, deadline, timeout)
            keys = None if self._disabled else self._keys.derive(payload)
        except Exception as exc:
            return _raising(exc)
        if keys is None:
            run = (lambda: callback(Unprotected())) if held else callback
            return self._lifecycle.unprotected(run, when, loop)
        return self._lifecycle.run(keys, when, callback, loop, held)

    async def _in_loop(
        self,
        payload: Any,
        callback: Callable[..., Awaitable[T]],
        deadline: float | None,
        timeout: float | None,
        held: bool,
    ) -> T:
        """:meth:`_door` for a call made before its event loop runs."""
        return await self._door(payload, callback, deadline, timeout, held)

    async def _observed(
        self,
        payload: Any,
        callback: Callable[..., Awaitable[T]],
        deadline: float | None,
        timeout: float | None,
        held: bool,
    ) -> T:
        """:meth:`_door` inside the call's span (a manager with telemetry)."""
        with self._span():
            return await self._door(payload, callback, deadline, timeout, held)

    def keyed(self, payload: Any) -> KeyedPayload:
        """``payload`` with its key derived once, for a front door that reads what is
        committed (:meth:`KeyedPayload.replay`) and then runs the call in a transaction
        (:meth:`KeyedPayload.execute_call_in_transaction`) — the HTTP middleware on
        transactional routes.  The key is derived when first needed, then reused."""
        return KeyedPayload(self, payload)

    async def execute_in_transaction(
        self,
        connection: TransactionConnection,
        payload: Any,
        callback: Callable[[], Awaitable[T]],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> T:
        """Run ``callback`` once for this payload's key inside the caller's database
        transaction, or replay the committed result (``PostgresStore`` only).

        ``connection`` (asyncpg, psycopg 3, or SQLAlchemy's ``AsyncConnection`` /
        ``AsyncSession`` bound to one engine) must be in a transaction: the claim, the
        writes ``callback`` makes through it and the completion are part of that
        transaction, and the **caller commits** it (or rolls it back, and then nothing of
        the call happened).  A COMMIT while the call has not finished (after a handled
        timeout or cancellation, or from inside the callback) is refused by the table's
        guard.  A duplicate waits on the key's row until this transaction ends, then
        replays what it committed or runs if it rolled back.  Nothing is cached before the
        commit.  Anything else (a pool, an engine) is ``ConfigError`` before any statement.
        See docs/postgres.md, "Transactional calls".
        """
        keyed = KeyedPayload(self, payload)
        return await keyed.execute_in_transaction(
            connection, callback, deadline=deadline, timeout=timeout
        )

    async def _in_transaction(
        self,
        connection: TransactionConnection,
        keyed: KeyedPayload,
        callback: Callable[..., Awaitable[T]],
        deadline: float | None,
        timeout: float | None,
        held: bool,
    ) -> T:
        """The transaction door: ``callback(call)`` when ``held``, ``callback()`` otherwise,
        on the keys ``keyed`` derived."""
        if not callable(callback):
            raise _not_callable(callback, held)
        bind = getattr(self.store, "transaction_store", None)
        if bind is None:
            raise ConfigError(
                "execute_in_transaction needs a manager on a PostgresStore (the record is "
                f"written in the caller's database transaction); this one has a "
                f"{type(self.store).__name__}"
            )
        loop = asyncio.get_running_loop()
        when = effective_deadline(loop, deadline, timeout)
        keys = None if self._disabled else keyed.keys
        transaction = await bind(connection)  # ConfigError unless it is in a transaction
        with self._span():  # (its store operations are the transaction's: not timed)
            if keys is None:
                run = (lambda: callback(Unprotected())) if held else callback
                return await self._lifecycle.unprotected(run, when, loop)
            lifecycle = self._lifecycle.in_transaction(transaction)
            return await lifecycle.run(keys, when, callback, loop, held)

    async def force_release(self, key: str) -> Record | None:
        """Delete the record of ``key`` whatever its state (operators: unstick a key).

        Returns the record deleted, if there was one.  Dangerous: if the original call is
        still running, a retry will run the side effect a second time.  This manager's local
        cache keeps no entry of the key, whatever replays ran meanwhile; other processes'
        local caches keep replaying the key until their entries expire.  While the original
        call runs, its own process still counts it as the key's holder (duplicates there
        are refused, or wait for it).
        """
        return await self._lifecycle.force_release(key)

    def report(self, kind: EventKind, key: str, *, error: BaseException | None = None) -> None:
        """Deliver an event about ``key`` as this manager's own (``Options(on_event=...)``,
        telemetry, the ``idempotency_async`` logger at DEBUG): for integrations that find
        something outside a call, e.g. ``transaction_not_run``."""
        self._lifecycle.emit(kind, key, error=error)

    def clear_cache(self) -> None:
        """Forget locally cached responses; the store is left alone."""
        self._lifecycle.replays.clear()

    async def replay(
        self,
        payload: Any,
        *,
        default: Any,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> Any:
        """The stored result of ``payload``'s key if its record is completed, read without
        claiming (one strongly consistent read, no local cache); ``default`` when there is
        no live record (or ``payload`` selects no key).

        A record in progress raises :class:`~idempotency_async.errors.AlreadyInProgressError`
        at once (no wait); one whose validation hash differs,
        :class:`~idempotency_async.errors.PayloadValidationError`; a completed one without
        its response, :class:`~idempotency_async.errors.ResponseNotStoredError`.  For
        front doors that must answer duplicates before deciding how to run the work (the
        HTTP middleware on transactional routes); the result is never cached, so a store
        that commits records in its callers' transactions is read as it committed them.

        ``timeout`` / ``deadline`` (and the ambient deadline) bound the read as they bound
        :meth:`execute`: past it, :class:`~idempotency_async.errors.DeadlineExceededError`
        (the read is cancelled, e.g. one waiting for a lock a migration holds).
        """
        keyed = KeyedPayload(self, payload)
        return await keyed.replay(default=default, deadline=deadline, timeout=timeout)

    async def _read(
        self, keyed: KeyedPayload, default: Any, deadline: float | None, timeout: float | None
    ) -> Any:
        """The read door, on the keys ``keyed`` derived."""
        loop = asyncio.get_running_loop()
        when = effective_deadline(loop, deadline, timeout)
        keys = None if self._disabled else keyed.keys
        if keys is None:
            return default
        return await self._lifecycle.read(keys, when, loop, default)


class KeyedPayload:
    """A payload and its key, derived once (when first needed) for every door it goes
    through: :meth:`Manager.keyed` makes one.  For a front door that answers from what is
    committed before it runs the work — the HTTP middleware reads a transactional route's
    record, then the endpoint runs its transactional call — with one derivation."""

    __slots__ = ("_keys", "_manager", "payload")

    def __init__(self, manager: Manager, payload: Any) -> None:
        self._manager = manager
        self.payload = payload
        """The payload, as given."""
        self._keys: Keys | _Underived | None = _UNDERIVED

    @property
    def keys(self) -> Keys | None:
        """The key and validation hash (None: the payload selects no key); derived on
        first use, errors included."""
        keys = self._keys
        if keys is _UNDERIVED:
            keys = self._keys = self._manager._keys.derive(self.payload)
        return keys  # type: ignore[return-value]

    @property
    def key(self) -> str | None:
        """The key the record is stored under, as :meth:`Manager.key_for` says (None: the
        payload selects no key)."""
        keys = self.keys
        return None if keys is None else keys.key

    async def replay(
        self, *, default: Any, deadline: float | None = None, timeout: float | None = None
    ) -> Any:
        """:meth:`Manager.replay` on this payload's key."""
        return await self._manager._read(self, default, deadline, timeout)

    async def execute_in_transaction(
        self,
        connection: TransactionConnection,
        callback: Callable[[], Awaitable[T]],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> T:
        """:meth:`Manager.execute_in_transaction` on this payload's key."""
        return await self._manager._in_transaction(
            connection, self, callback, deadline, timeout, False
        )

    async def execute_call_in_transaction(
        self,
        connection: TransactionConnection,
        callback: Callable[[Call], Awaitable[T]],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> T:
        """:meth:`Manager.execute_in_transaction` on this payload's key, for work that
        receives the :class:`~idempotency_async.Call`, as :meth:`Manager.execute_call`'s.

        ``call.release(reason)`` undoes the call when the callback returns — its writes
        roll back with its savepoint, no record is left — while its return value still
        goes to the caller: for an answer that must not be replayed, such as a server
        error.  ``call.complete(result)`` writes the completion in the transaction at once
        (the deadline no longer cuts the callback off); nothing of it is seen before the
        caller commits.
        """
        return await self._manager._in_transaction(
            connection, self, callback, deadline, timeout, True
        )


class _Underived:
    """The key of a :class:`KeyedPayload` not derived yet."""

    __slots__ = ()


_UNDERIVED = _Underived()


def _check_record_format(store: Store, options: Options) -> None:
    # Powertools-format keys with TypeScript-format records (or the reverse) would be
    # records neither port can replay: a silent loss of state, refused up front.
    record_format = getattr(store, "record_format", None)
    if record_format is not None and record_format != options.key_format:
        raise ConfigError(
            f"the store writes {record_format!r} records but Options(key_format="
            f"{options.key_format!r}): use the same format on both, e.g. "
            f"{type(store).__name__}(..., record_format={options.key_format!r})"
        )
    declared = declared_errors(options.replay_errors)
    if record_format is not None and declared is not None and not declared.private_records:
        # Its readers (the TypeScript and Powertools ports) replay any completed record's
        # data as the function's return value: a stored error would be a success there.
        raise ConfigError(
            f"replay_errors with {type(store).__name__}: its records use the "
            f"{record_format!r} layout, whose other readers (the TypeScript and Powertools "
            "ports) would replay a stored error as a successful result. If only this "
            "library reads these records, say so: ReplayErrors(..., private_records=True)"
        )


async def _raising(error: Exception) -> Any:
    """A coroutine raising ``error`` when awaited: where a door reports what it refused
    before any I/O."""
    raise error


def _not_callable(callback: object, held: bool = False) -> ConfigError:
    if held:
        return ConfigError(
            "callback must be a callable taking the Call and returning an awaitable; "
            f"got {type(callback).__name__}"
        )
    return ConfigError(
        "callback must be a zero-argument callable returning an awaitable, e.g. "
        f"lambda: charge(order); got {type(callback).__name__}"
    )
