"""Exception types raised by idempotency-async.

Every exception derives from :class:`IdempotencyError`, so callers can catch the
whole family at once.  Messages say what went wrong *and* what to do about it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "IdempotencyError",
    "ConfigError",
    "PayloadError",
    "BatchEventError",
    "KeyMissingError",
    "PayloadValidationError",
    "AlreadyInProgressError",
    "LockTimeoutError",
    "TransactionRetryError",
    "SerializationFailureError",
    "DeadlockDetectedError",
    "DeadlineExceededError",
    "InconsistentStateError",
    "LeaseLostError",
    "CompletionError",
    "ResponseNotStoredError",
    "ResponseTooLargeError",
    "ResponseEncodingError",
    "ReplayedError",
    "PersistenceError",
    "StoreThrottledError",
    "StoreAccessDeniedError",
    "StoreUnavailableError",
    "StoreValidationError",
    "NoDownstreamKeyError",
    "StepMismatchError",
    "StepResultNotStoredError",
    "StepNotRecordedError",
]


class IdempotencyError(Exception):
    """Base class of every error this library raises."""


class ConfigError(IdempotencyError, ValueError):
    """Options, a store or an integration was configured with an invalid value."""


class PayloadError(IdempotencyError, ValueError):
    """The payload cannot be turned into an idempotency key.

    Raised before any store write.  ``path`` is a JSONPath-like location of the
    offending value (``$.items[3].price``) when one is known.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class BatchEventError(PayloadError):
    """An event given to batch processing is not a batch of the expected kind.

    Also raised for a record too broken to be reported on its own (not an object, or
    without the identifier ``batchItemFailures`` names records by), before any record runs.
    """


class KeyMissingError(PayloadError):
    """The key expression selected nothing and ``raise_on_no_key`` is set."""


class PayloadValidationError(IdempotencyError):
    """A duplicate request carried a different payload than the one stored for its key."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class AlreadyInProgressError(IdempotencyError):
    """Another caller holds the key and has not finished yet.

    ``retry_after`` is the number of seconds until the holder's lease ends and the key
    becomes claimable again, as the store judged it; ``lease_end`` is that instant as Unix
    time (seconds) by this process's clock.  Both are ``None`` when unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str,
        lease_end: float | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.lease_end = lease_end
        self.retry_after = retry_after


class LockTimeoutError(AlreadyInProgressError):
    """A transactional call (``Manager.execute_in_transaction``) waited for the row of its
    key, held by another open transaction, as long as it may (``Options.wait``'s ``timeout`` or
    its deadline; at once with ``wait=None``).  Only the library's savepoint was rolled
    back: the caller's transaction is intact and may go on, or retry the call later."""


class TransactionRetryError(IdempotencyError):
    """A transactional call met a conflict PostgreSQL resolves by failing one transaction:
    roll the caller's transaction back and run all of it again.  ``sqlstate`` is the
    server's code.  Nothing of the call was committed."""

    def __init__(self, message: str, *, key: str, sqlstate: str) -> None:
        super().__init__(message)
        self.key = key
        self.sqlstate = sqlstate


class SerializationFailureError(TransactionRetryError):
    """SQLSTATE 40001: under REPEATABLE READ or SERIALIZABLE the key's record changed after
    the transaction's snapshot (a duplicate committed meanwhile), so its answer cannot be
    seen from this transaction.  Retry the whole transaction: it will replay."""


class DeadlockDetectedError(TransactionRetryError):
    """SQLSTATE 40P01: the caller's transaction and another one each waited for rows the
    other held; PostgreSQL chose this one to fail.  Retry the whole transaction."""


class DeadlineExceededError(IdempotencyError, TimeoutError):
    """The call's own deadline or lease ran out: its callback was cut off.

    Raised when the manager cuts the callback off a small reserve before the lease ends
    (so that nobody else can claim the key while it still runs), and when a call without
    a key runs past its ``timeout``.  Nothing was recorded; the key becomes claimable again
    once the lease ends.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class InconsistentStateError(IdempotencyError):
    """The store kept answering with a record that looked claimable but could not be claimed,
    or it holds a record for the key that cannot be read: its control fields (status,
    expiry, lease, owner) are malformed — a foreign or damaged record.  Delete it with
    ``Manager.force_release`` (or the CLI's ``release``) to free the key."""


class CompletionError(IdempotencyError):
    """The callback succeeded but its result could not be recorded.

    The side effect happened: ``result`` carries what the callback returned.  The record
    stays in progress until its lease ends — unless the write applied after all:
    ``outcome_unknown`` is True when the write was abandoned at the lease end or its answer
    was lost, so the record may be completed.
    """

    def __init__(
        self, message: str, *, key: str, result: Any, outcome_unknown: bool = False
    ) -> None:
        super().__init__(message)
        self.key = key
        self.result = result
        self.outcome_unknown = outcome_unknown


class LeaseLostError(CompletionError):
    """The lease lapsed and another worker claimed the key before this one finished.

    The callback's result is in ``result``; the other worker's record was left intact.
    """


class ResponseNotStoredError(IdempotencyError):
    """The original call succeeded, but its response was not stored, so it cannot be replayed.

    ``reason`` is the text the record keeps about why, when its writer gave one.
    """

    def __init__(self, message: str, *, key: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.reason = reason


class ResponseTooLargeError(IdempotencyError):
    """An encoded response is larger than the store accepts.

    Never raised once the callback has run (its record is completed as "response not
    stored" instead); it is the ``error`` of the ``response_not_stored`` event.
    """

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class ResponseEncodingError(IdempotencyError, TypeError):
    """A callback returned a value that cannot be stored as JSON."""


class ReplayedError(IdempotencyError):
    """The first call for the key raised an error it declared a result (``replay_errors``),
    and that error's type cannot be rebuilt here: it is not one of the classes this
    manager declares (or a loaded subclass of one), or building it failed.

    ``error_type`` is the stored ``module:qualname`` (never imported), ``message`` its
    text, ``data`` the JSON value the error declared (``None`` when it declared none).
    All three come from the store: treat them as untrusted input.
    """

    def __init__(
        self, message: str, *, key: str, error_type: str, error_message: str, data: Any = None
    ) -> None:
        super().__init__(message)
        self.key = key
        self.error_type = error_type
        self.error_message = error_message
        self.data = data


class PersistenceError(IdempotencyError):
    """The store failed; the original backend exception is the ``__cause__``."""


class StoreThrottledError(PersistenceError):
    """The store refused the request because of its rate or capacity limits."""


class StoreAccessDeniedError(PersistenceError):
    """The credentials in use lack a permission the store needs."""


class StoreUnavailableError(PersistenceError):
    """The store could not be reached, or did not answer in time."""


class StoreValidationError(PersistenceError):
    """The store rejected a request as malformed (wrong table, schema or attribute names)."""


class NoDownstreamKeyError(IdempotencyError, LookupError):
    """:func:`~idempotency_async.downstream.downstream_key` was called where no idempotent
    callback runs (outside any call, in a call run without idempotency, or after the call
    ended).  ``name`` is the name it was asked for."""

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name


class StepMismatchError(IdempotencyError):
    """A retry asked for another step than the record holds at that position: the step
    names and order of a call changed between its runs (a deploy that renamed, inserted or
    reordered a step, or a step chosen by data or time).  The step's function did not run;
    the recorded progress is kept.  Every retry meets the same mismatch until the record
    expires or an operator releases it (``idempotency-async release``).

    ``position`` counts from 0; ``recorded`` is the name the record holds there, ``asked``
    the name this run gave.
    """

    def __init__(self, message: str, *, key: str, position: int, recorded: str, asked: str) -> None:
        super().__init__(message)
        self.key = key
        self.position = position
        self.recorded = recorded
        self.asked = asked


class StepResultNotStoredError(IdempotencyError):
    """A step ran but its result could not be stored (not a JSON value, or the step list
    would pass the store's ``max_response_bytes``).  Its recovery point was recorded
    without the result, so the step never runs again while the record lives; this error is
    raised now and on every resume that reaches the step.  ``step`` names it, ``reason``
    says why."""

    def __init__(self, message: str, *, key: str, step: str, reason: str) -> None:
        super().__init__(message)
        self.key = key
        self.step = step
        self.reason = reason


class StepNotRecordedError(CompletionError):
    """A step ran but writing its recovery point failed or got no answer.  Its effect has
    happened (``result`` is what it returned); the key is not released — it stays in
    progress until its lease ends, after which a retry runs this step again (unless the
    write applied after all: ``outcome_unknown``)."""
