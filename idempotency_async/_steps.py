"""Recovery points: the steps of one idempotent call, recorded on its record as they finish.

A call's single-flight entry (``_flight.Flight``) carries its steps in one slot: the
lifecycle's shared :class:`Stepper` until the call takes (or resumes) a step, then the
call's own :class:`Progress`.  A call that takes no step allocates nothing for them.

A step's effect happens before its recovery point is written, as a call's effect happens
before its completion: the write is owner-fenced, and one that fails leaves the key to its
lease (``Progress.unsettled``: the lifecycle abandons instead of releasing), so a step is
at most once per lease and never runs again once recorded while the record lives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Final, TypeVar

from idempotency_async._downstream import CURRENT
from idempotency_async._emission import Emitter
from idempotency_async._flight import Flight
from idempotency_async._json import StoredDataError, decode_json, decode_stored, encode_json
from idempotency_async.errors import (
    ConfigError,
    InconsistentStateError,
    LeaseLostError,
    StepMismatchError,
    StepNotRecordedError,
    StepResultNotStoredError,
    StoreUnavailableError,
)
from idempotency_async.options import Options
from idempotency_async.record import Record
from idempotency_async.stores.base import Stepped, StepTransaction, StepWrite, Store

__all__ = [
    "MAX_STEPS",
    "MAX_STEP_NAME",
    "UNPROTECTED",
    "Progress",
    "Stepper",
    "current_step",
    "run_step",
]

T = TypeVar("T")

MAX_STEPS: Final = 64
"""The most steps one call may record."""
MAX_STEP_NAME: Final = 100
"""The longest step name, in characters."""

UNPROTECTED: Final[ContextVar[bool]] = ContextVar("idempotency_async.unprotected", default=False)
"""True while a call runs without idempotency (no key, or disabled): steps run unrecorded."""


class Stepper:
    """Records the steps of one lifecycle's calls: shared by them, one per lifecycle.

    ``refusal``: why this lifecycle's calls cannot record steps (a store without the
    capability), raised as ``ConfigError`` before a step's function runs; ``records``
    False: steps run and record nothing (a call in a caller's transaction, which commits
    or rolls back as a whole).
    """

    __slots__ = ("emitter", "options", "records", "refusal", "store")

    def __init__(
        self,
        store: Store,
        options: Options,
        emitter: Emitter,
        *,
        capable: bool,
        records: bool = True,
    ) -> None:
        self.store = store
        self.options = options
        self.emitter = emitter
        self.records = records
        self.refusal: str | None = None
        if records and not capable:
            self.refusal = (
                f"{type(store).__name__} does not record steps (recovery points): use a store "
                "that does (MemoryStore, RedisStore, PostgresStore, DynamoDBStore), or call the "
                "step's function directly"
            )

    def resume(self, record: Record) -> Progress:
        """The progress a claim kept (``record.steps``), checked: a malformed list is
        ``InconsistentStateError`` (the record is damaged; nothing runs)."""
        text = record.steps
        assert text is not None
        try:
            if len(text) > 2 * self.store.max_response_bytes + 2:
                raise StoredDataError("longer than the store's bound")
            steps = decode_stored(text, exact=True)  # wide integers stay exact
            recorded = [_entry(item) for item in steps] if isinstance(steps, list) else None
        except (StoredDataError, ValueError, TypeError) as exc:
            raise _unreadable(record.key, str(exc)) from None
        if recorded is None or len(recorded) > MAX_STEPS:
            raise _unreadable(record.key, "not a list of at most 64 steps")
        return Progress(self, recorded)


class Progress:
    """The steps of one call: those its claim resumed, and those it recorded since."""

    __slots__ = ("current", "entries", "names", "position", "recorded", "stepper", "unsettled")

    def __init__(self, stepper: Stepper, recorded: list[tuple[str, bytes, str | None]]) -> None:
        self.stepper = stepper
        self.recorded = recorded
        """What the record held when the call claimed it: (name, encoded entry, reason
        not stored) per step."""
        self.entries = [entry for _, entry, _ in recorded]
        """Every step's encoded entry, in order (the list the next write sends)."""
        self.names: set[str] = set()
        self.position = 0
        """How many steps this run has taken (replayed or run)."""
        self.current: str | None = None
        """The step running now (its name scopes downstream keys)."""
        self.unsettled = False
        """A step ran and its recovery point may or may not be on the record: the call
        must not release the key (a retry would run the step again before the lease
        ends)."""

    async def run(
        self,
        flight: Flight,
        name: str,
        fn: Callable[[], Awaitable[T]],
        connection: Any = None,
    ) -> T:
        key = flight.keys.key
        _check_step(self, flight, name, key)
        position = self.position
        self.names.add(name)
        if position < len(self.recorded):
            recorded, entry, skipped = self.recorded[position]
            if recorded != name:
                raise StepMismatchError(
                    f"key {key}: step {position + 1} is {name!r} in this run but the record "
                    f"holds {recorded!r} there: the steps of a call must come in the same "
                    "order on every run. Nothing ran; the recorded progress is kept until the "
                    "record expires or an operator releases it (idempotency-async release)",
                    key=key,
                    position=position,
                    recorded=recorded,
                    asked=name,
                )
            self.position = position + 1
            self.stepper.emitter.emit("step_replayed", key)
            if skipped is not None:
                raise _not_stored(key, name, skipped)
            return decode_json(entry)[1]  # type: ignore[no-any-return]
        stepper = self.stepper
        transaction: StepTransaction | None = None
        if connection is not None and stepper.records:
            # A transactional step: its own transaction on the caller's connection, opened
            # before ``fn`` runs (a connection the store cannot use is ConfigError here).
            try:
                transaction = await _begin(stepper, name, connection)
            except BaseException:
                self.names.discard(name)  # not taken: the name may be used again
                raise
        self.current = name
        try:
            pending: Any = fn()
            result: Any = await pending if hasattr(pending, "__await__") else pending
        except BaseException:
            if transaction is not None:
                await transaction.rollback()
            raise
        finally:
            self.current = None
        self.position = position + 1
        if not stepper.records:
            return result  # type: ignore[no-any-return]
        # The step ran: from here on it must be recorded, or the key left to its lease.
        self.unsettled = True
        limit = stepper.store.max_response_bytes
        reason: str | None = None
        try:
            entry = encode_json([name, result])
        except Exception:  # not JSON: recorded without its result
            # (Not the encoder's message: its advice, a response codec, is not for steps.)
            reason = f"the step's result ({type(result).__name__:.80}) is not a JSON value"
        else:
            if _listed_size(self.entries, entry) > limit:
                reason = (
                    f"the step's result ({len(entry)} bytes of JSON) would take the step "
                    f"list past the store's limit of {limit} bytes"
                )
        cancelled: list[asyncio.CancelledError] = []
        if reason is None:
            stepped = await _write(
                stepper, flight, position, [*self.entries, entry], result, cancelled, transaction
            )
            if stepped is Stepped.TOO_LARGE:
                reason = "the step list did not fit the store's record"
        if reason is not None and not cancelled:
            entry = encode_json([name, None, reason])
            stepped = Stepped.TOO_LARGE  # the list is full: not even the mark fits
            if _listed_size(self.entries, entry) <= limit:
                stepped = await _write(
                    stepper,
                    flight,
                    position,
                    [*self.entries, entry],
                    result,
                    cancelled,
                    transaction,
                )
        if cancelled:
            # The call was cancelled (its cutoff, or its caller) while the write was in
            # flight: what the write answered is settled, and nothing more is sent.
            if stepped is Stepped.RECORDED:
                self.entries.append(entry)
                self.unsettled = False
                stepper.emitter.emit("step_recorded", key)
            raise cancelled[0]
        if stepped is Stepped.TOO_LARGE:
            if transaction is not None:
                await transaction.rollback()  # its effects are undone: nothing to keep
                self.unsettled = False
            raise StepNotRecordedError(
                f"key {key}: step {name!r} ran but the step list is full: not even a mark "
                f"that its result was not stored fits the store's limit ({reason}). The key "
                "stays in progress until its lease ends, then a retry runs this step again. "
                "The step's result is on this error",
                key=key,
                result=result,
                outcome_unknown=False,
            )
        if stepped is not Stepped.RECORDED:
            error = LeaseLostError(
                f"key {key}: the recovery point of step {name!r} was not recorded: the lease "
                "ended and another worker claimed the key (its record was left intact). The "
                "step's result is on this error",
                key=key,
                result=result,
            )
            stepper.emitter.emit("lease_lost", key, error=error)
            raise error
        self.entries.append(entry)
        self.unsettled = False
        stepper.emitter.emit("step_recorded", key)
        if reason is not None:
            raise _not_stored(key, name, reason)
        return result  # type: ignore[no-any-return]


async def run_step(name: str, fn: Callable[[], Awaitable[T]], connection: Any = None) -> T:
    """What ``steps.step`` does: find the running call, and take the step in it
    (``connection``: a transactional step's, see :class:`~idempotency_async.stores.base.
    RecordsStepsIn`)."""
    run = CURRENT.get()
    if run is None or not run.open:
        if UNPROTECTED.get():
            return await _call(fn)
        raise ConfigError(
            f"step({name!r}) was called outside a running idempotent call: a step is taken "
            "only inside the callback of a call (and tasks it spawns, until it ends)"
        )
    if not isinstance(run, Flight):  # pragma: no cover - the lifecycle's runs are flights
        raise ConfigError(f"step({name!r}) was called outside a running idempotent call")
    steps = run.steps
    if steps.__class__ is Stepper:
        assert isinstance(steps, Stepper)
        if steps.refusal is not None:
            raise ConfigError(steps.refusal)
        steps = run.steps = Progress(steps, [])
    assert isinstance(steps, Progress)
    return await steps.run(run, name, fn, connection)


def current_step(run: object) -> str | None:
    """The name of the step ``run`` (a call's flight) is running now, if any."""
    steps = getattr(run, "steps", None)
    return steps.current if isinstance(steps, Progress) else None


def _check_step(progress: Progress, flight: Flight, name: str, key: str) -> None:
    if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME:
        raise ConfigError(
            f"a step needs a name: a non-empty str of at most {MAX_STEP_NAME} characters, "
            f"got {name!r:.120}"
        )
    if progress.current is not None:
        raise ConfigError(
            f"key {key}: step {name!r} started while step {progress.current!r} runs: steps "
            "of one call run one at a time (not nested, not under asyncio.gather), so that "
            "their order is the same on every run"
        )
    if progress.unsettled:
        raise ConfigError(
            f"key {key}: step {name!r} was taken after a step whose recovery point was not "
            "recorded (StepNotRecordedError or LeaseLostError, caught): what the record "
            "holds is unknown, so no later step of this call can be recorded. Let that error "
            "propagate: the key is left to its lease, and a retry after it resumes"
        )
    if name in progress.names:
        raise ConfigError(
            f"key {key}: step {name!r} was taken twice in one call: step names are unique "
            "within a call (in a loop, name each one: f'charge-{n}')"
        )
    if progress.position >= MAX_STEPS:
        raise ConfigError(f"key {key}: a call may take at most {MAX_STEPS} steps")
    if not flight.holding():
        raise ConfigError(
            f"key {key}: step {name!r} was taken after the call was completed "
            "(Call.complete): a completed record holds no progress"
        )


async def _begin(stepper: Stepper, name: str, connection: Any) -> StepTransaction:
    """The transactional step's transaction, opened on ``connection`` by the store
    (``RecordsStepsIn``); ``ConfigError`` when the store has no such steps."""
    begin = getattr(stepper.store, "begin_step", None)
    if begin is None:
        raise ConfigError(
            f"step({name!r}, connection=...) is a transactional step, which needs a "
            f"PostgresStore; this call's store is {type(stepper.store).__name__}. Drop "
            "connection= to record the step as a plain one"
        )
    transaction: StepTransaction = await begin(connection)
    return transaction


async def _write(
    stepper: Stepper,
    flight: Flight,
    position: int,
    entries: list[bytes],
    result: Any,
    cancelled: list[asyncio.CancelledError],
    transaction: StepTransaction | None = None,
) -> Stepped:
    """Write the step list ``entries`` as the record's recovery point: bounded at the
    lease end (not the cutoff), its failures raised as ``StepNotRecordedError``.

    The step has run: once sent, its write is awaited to its answer (or the lease end)
    even when the call is cancelled meanwhile — by its own cutoff or by its caller — so
    that a recorded step is known recorded.  Such a cancellation is appended to
    ``cancelled`` for the caller to raise once the answer is settled."""
    lease = flight.lease
    assert lease is not None
    key = lease.key
    options = stepper.options
    write = StepWrite(
        key,
        lease.owner,
        options.clock(),
        options.expires_after,
        position,
        (b"[" + b",".join(entries) + b"]").decode(),
    )
    loop = asyncio.get_running_loop()
    sending = loop.create_task(
        stepper.store.record_step(write)  # type: ignore[attr-defined]
        if transaction is None
        else transaction.record(write)
    )
    expiry = loop.call_at(lease.write_bound(loop.time()), sending.cancel)
    current = asyncio.current_task()
    seen = 0 if current is None else current.cancelling()
    try:
        while not sending.done():
            try:
                await asyncio.shield(sending)
            except asyncio.CancelledError as cancel:
                if current is not None and current.cancelling() > seen:
                    seen = current.cancelling()
                    cancelled.append(cancel)  # this call's: raised once the write settled
            except Exception:  # read from ``sending`` below
                pass
    finally:
        expiry.cancel()
    if sending.cancelled():
        if cancelled:
            return Stepped.LOST  # not raised: the cancellation is
        raise StepNotRecordedError(
            f"key {key}: the step at position {position + 1} ran but recording it got no "
            "answer before the lease end: the key stays in progress until its lease ends, "
            "then a retry runs this step again. The step's result is on this error",
            key=key,
            result=result,
            outcome_unknown=True,
        ) from TimeoutError("the step write got no answer before the lease end")
    failure = sending.exception()
    if failure is not None:
        if cancelled:
            return Stepped.LOST
        unknown = not isinstance(failure, ConfigError)
        raise StepNotRecordedError(
            f"key {key}: the step at position {position + 1} ran but recording it failed "
            f"({failure!r}): the key stays in progress until its lease ends, then a retry runs "
            "this step again. The step's result is on this error",
            key=key,
            result=result,
            outcome_unknown=unknown,
        ) from failure
    stepped = sending.result()
    if stepped.__class__ is not Stepped:
        if cancelled:
            return Stepped.LOST
        raise StepNotRecordedError(
            f"key {key}: the store answered a step write with {stepped!r}",
            key=key,
            result=result,
            outcome_unknown=True,
        ) from StoreUnavailableError(f"not an answer: {stepped!r}")
    return stepped


def _listed_size(entries: list[bytes], entry: bytes) -> int:
    return 2 + sum(len(e) + 1 for e in entries) + len(entry)


def _entry(item: Any) -> tuple[str, bytes, str | None]:
    """One recorded step read back: ``[name, result]`` or ``[name, null, reason]``."""
    if not isinstance(item, list) or not item or not isinstance(item[0], str):
        raise ValueError("an entry is not [name, result]")
    if len(item) == 2:
        return item[0], encode_json(item), None
    if len(item) == 3 and item[1] is None and isinstance(item[2], str):
        return item[0], encode_json(item), item[2]
    raise ValueError("an entry is not [name, result] or [name, null, reason]")


def _unreadable(key: str, why: str) -> InconsistentStateError:
    return InconsistentStateError(
        f"the record of key {key} holds recovery points that cannot be read ({why:.200}): "
        "nothing ran. Remove the record with Manager.force_release or "
        "`idempotency-async release` to start the call again from its first step"
    )


def _not_stored(key: str, name: str, reason: str) -> StepResultNotStoredError:
    return StepResultNotStoredError(
        f"key {key}: step {name!r} ran, but its result was not stored ({reason}); it will "
        "not run again while the record lives. Return a JSON value within the store's "
        "limit, or catch this error where the result is not needed",
        key=key,
        step=name,
        reason=reason,
    )


async def _call(fn: Callable[[], Awaitable[T]]) -> T:
    pending: Any = fn()
    return await pending if hasattr(pending, "__await__") else pending  # type: ignore[no-any-return]
