"""One table from an error of the manager to the middleware's answer, for every route kind.

A plain route's claim and call (:mod:`._exchange`) and the completion writes of its
response (:mod:`._gate`), a transactional route's read of what is committed and its call
inside the endpoint's transaction (:mod:`._transaction`) all turn the manager's errors
into answers here, through :data:`TABLE`: the error's type (its
nearest class in the table) and the :class:`Stage` the request was in give an
:class:`Answer`, and :func:`respond` makes the response.  An error the table does not name
is the endpoint's own (or a bug): it propagates.

::

    error ──> Stage ──> Answer ──> 409 | 422 | 504 | 503 | the stored status (not stored)
                               └─> RAISE (propagates) | SENT (the endpoint's response is out)
"""

from __future__ import annotations

import enum
import logging
import math
from typing import Final

from idempotency_async.errors import (
    AlreadyInProgressError,
    CompletionError,
    DeadlineExceededError,
    InconsistentStateError,
    PayloadValidationError,
    PersistenceError,
    ResponseNotStoredError,
    TransactionRetryError,
)
from idempotency_async.integrations._http._responses import HttpResponse, not_available, problem
from idempotency_async.integrations._http._rules import HttpIdempotency

__all__ = ["TABLE", "Answer", "Stage", "decide", "respond", "retry_after"]

# Retry-After of a 503 for a record the store found inconsistent (at least a minute).
_INCONSISTENT_RETRY_AFTER: Final = 60

_log = logging.getLogger("idempotency_async.http")


class Stage(enum.Enum):
    """Where a request was when the manager raised."""

    CLAIMING = "a plain route, before its endpoint ran (the claim, a wait, a replay)"
    RUNNING = "a plain route whose endpoint ran, before a response head of its went out"
    FORWARDED = "a plain route whose endpoint's response head went (or is going) out"
    READING = "a transactional route, reading what is committed before its endpoint runs"
    IN_TRANSACTION = "a transactional route's call inside the endpoint's own transaction"


class Answer(enum.Enum):
    """What the middleware does about an error."""

    RAISE = "propagate: the error is the endpoint's own, or nothing can be answered"
    SENT = "send nothing more: the endpoint's response is out, cut short or whole"
    SENT_UNRECORDED = "send nothing more, and log that the response was not recorded"
    IN_PROGRESS = "409: the key is in progress, retry after the seconds the work takes"
    REUSED = "422: the key was first sent with another request"
    NOT_STORED = "the stored status: processed, but the response cannot be replayed"
    CONFLICTED = "409: the transaction conflicted with a concurrent one, retry"
    TIMED_OUT = "504: cut off; the key stays in progress until its lease ends"
    ROLLED_BACK = "504: cut off and rolled back; retry at once"
    UNAVAILABLE = "503: the store failed before the request ran"


_S, _A = Stage, Answer


def _row(
    claiming: Answer,
    running: Answer,
    forwarded: Answer,
    reading: Answer,
    in_transaction: Answer,
) -> dict[Stage, Answer]:
    return {
        _S.CLAIMING: claiming,
        _S.RUNNING: running,
        _S.FORWARDED: forwarded,
        _S.READING: reading,
        _S.IN_TRANSACTION: in_transaction,
    }


# fmt: off
TABLE: Final[dict[type[Exception], dict[Stage, Answer]]] = {
    #                        CLAIMING        RUNNING              FORWARDED
    #                        READING         IN_TRANSACTION
    AlreadyInProgressError: _row(
                             _A.IN_PROGRESS, _A.IN_PROGRESS,      _A.IN_PROGRESS,
                             _A.IN_PROGRESS, _A.IN_PROGRESS),
    PayloadValidationError: _row(
                             _A.REUSED,      _A.REUSED,           _A.REUSED,
                             _A.REUSED,      _A.REUSED),
    ResponseNotStoredError: _row(
                             _A.NOT_STORED,  _A.NOT_STORED,       _A.NOT_STORED,
                             _A.NOT_STORED,  _A.NOT_STORED),
    # Only a transactional call meets a serialization failure or a deadlock.
    TransactionRetryError: _row(
                             _A.RAISE,       _A.RAISE,            _A.RAISE,
                             _A.RAISE,       _A.CONFLICTED),
    # Past the point of no return a cutoff leaves the response as it went out; a read
    # that outlived the deadline (a table locked by a migration) is the store's failure.
    DeadlineExceededError: _row(
                             _A.TIMED_OUT,   _A.TIMED_OUT,        _A.SENT,
                             _A.UNAVAILABLE, _A.ROLLED_BACK),
    # Once the endpoint ran, a store failure no longer means "the request was not
    # processed": it propagates.
    PersistenceError: _row(
                             _A.UNAVAILABLE, _A.RAISE,            _A.RAISE,
                             _A.UNAVAILABLE, _A.UNAVAILABLE),
    InconsistentStateError: _row(
                             _A.UNAVAILABLE, _A.RAISE,            _A.RAISE,
                             _A.UNAVAILABLE, _A.UNAVAILABLE),
    # A completion write failed after the endpoint ran: its answer is out, nothing is
    # left to tell the client.
    CompletionError: _row(
                             _A.RAISE,       _A.SENT_UNRECORDED,  _A.SENT_UNRECORDED,
                             _A.RAISE,       _A.RAISE),
}
# fmt: on
"""Error type by stage: the answer.  An error answers by the nearest class of its type's MRO
that the table names (``LockTimeoutError`` as ``AlreadyInProgressError``,
``LeaseLostError`` as ``CompletionError``); any other error propagates."""


def decide(error: BaseException, stage: Stage) -> Answer:
    """What the middleware does about ``error`` raised at ``stage`` (a pure look-up)."""
    for cls in type(error).__mro__:
        row = TABLE.get(cls)
        if row is not None:
            return row[stage]
    return Answer.RAISE


def respond(answer: Answer, error: BaseException, rules: HttpIdempotency) -> HttpResponse | None:
    """The response for ``answer`` (None: nothing more to send).  RAISE is the caller's."""
    if answer is Answer.IN_PROGRESS:
        assert isinstance(error, AlreadyInProgressError)
        return _in_progress(error, rules)
    if answer is Answer.REUSED:
        return _reused()
    if answer is Answer.NOT_STORED:
        assert isinstance(error, ResponseNotStoredError)
        return not_available(error.reason, rules.settings.replayed_header)
    if answer is Answer.CONFLICTED:
        # Nothing of the request committed and the conflict was with a concurrent
        # transaction: the client retries with the same key, as after any 409.
        return problem(
            409,
            "Request conflicted",
            "this request's transaction conflicted with a concurrent one and was rolled "
            "back: retry it with the same Idempotency-Key",
            headers=(("retry-after", "1"),),
        )
    timeout = rules.settings.request_timeout
    if answer is Answer.TIMED_OUT:
        return problem(
            504,
            "Request timed out",
            f"the request did not finish within {timeout:g} s; its Idempotency-Key stays in "
            "progress for a few seconds more",
            headers=(("retry-after", str(math.ceil(timeout))),),
        )
    if answer is Answer.ROLLED_BACK:
        return problem(
            504,
            "Request timed out",
            f"the request did not finish within {timeout:g} s and was rolled back: retry "
            "it with the same Idempotency-Key",
            headers=(("retry-after", "1"),),
        )
    if answer is Answer.UNAVAILABLE:
        return _store_unavailable(error)
    if answer is Answer.SENT_UNRECORDED:
        _log.error("recording the response failed; it is sent all the same: %s", error)
        return None
    assert answer is Answer.SENT, answer
    return None


def retry_after(exc: AlreadyInProgressError, rules: HttpIdempotency) -> int:
    """The seconds a client is told to wait before retrying a request still in progress.

    As long as the first request has run so far (work that took 2 s is likely done 2 s
    later), at least 1 and never past the holder's lease end (the key is claimable then).
    The run time is derived from the lease left: the holder's lease is this middleware's
    ``request_timeout`` plus the manager's ``lease_margin`` from its start.
    """
    if exc.retry_after is None:
        return 1
    # Leases are kept to the millisecond; rounding first keeps a lease of 5.0004 s at 5.
    left = max(1, math.ceil(round(exc.retry_after, 3)))
    lease = rules.settings.request_timeout + rules.manager.options.lease_margin
    ran = lease - exc.retry_after
    return min(max(1, math.ceil(round(ran, 3))), left)


def _in_progress(exc: AlreadyInProgressError, rules: HttpIdempotency) -> HttpResponse:
    seconds = retry_after(exc, rules)
    return problem(
        409,
        "Request in progress",
        f"a request with this Idempotency-Key is still being processed: retry after {seconds} s",
        headers=(("retry-after", str(seconds)),),
    )


def _store_unavailable(exc: BaseException) -> HttpResponse:
    # The store's message names endpoints, tables and SDK advice: for the operator's log,
    # never for the client.
    if isinstance(exc, InconsistentStateError):
        # A record the store cannot make sense of stays until an operator removes it (or
        # it expires): retrying at once would only meet it again.
        _log.error(
            "the idempotency record of this request is inconsistent (remove it with the CLI "
            "if it persists); answered 503",
            exc_info=exc,
        )
        wait = _INCONSISTENT_RETRY_AFTER
    else:
        _log.error("idempotency store failed before the request ran; answered 503", exc_info=exc)
        wait = 1
    return problem(
        503,
        "Service unavailable",
        "the request was not processed: retry it with the same Idempotency-Key",
        headers=(("retry-after", str(wait)),),
    )


def _reused() -> HttpResponse:
    """422: the key was first sent with another request."""
    return problem(
        422,
        "Idempotency-Key reused",
        "this request differs from the one first sent with this Idempotency-Key (its "
        "path, query, content type or body): send that request unchanged to get its "
        "response, or use a new key for a new request",
    )
