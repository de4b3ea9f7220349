"""The one table from the manager's errors to the middleware's answers, enumerated.

Every error type the library defines (and one it does not) at every stage of a request,
for plain and transactional routes alike: the answer is the one written below in HTTP
terms, and the response made for it has that status.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from idempotency_async import Manager, MemoryStore, errors
from idempotency_async.integrations._http import HttpIdempotency, HttpSettings
from idempotency_async.integrations._http._answers import TABLE, Answer, Stage, decide, respond

# What each error means at each stage: an HTTP status, "raise" (it propagates), or
# "sent" (nothing more goes out).  Columns: CLAIMING, RUNNING, FORWARDED, READING,
# IN_TRANSACTION.  Subclasses mean what their nearest listed base means.
EXPECTED: list[tuple[type[BaseException], tuple[int | str, ...]]] = [
    (errors.AlreadyInProgressError, (409, 409, 409, 409, 409)),
    (errors.PayloadValidationError, (422, 422, 422, 422, 422)),
    # The status the record's reason names (201 below).
    (errors.ResponseNotStoredError, (201, 201, 201, 201, 201)),
    (errors.TransactionRetryError, ("raise", "raise", "raise", "raise", 409)),
    (errors.DeadlineExceededError, (504, 504, "sent", 503, 504)),
    (errors.PersistenceError, (503, "raise", "raise", 503, 503)),
    (errors.InconsistentStateError, (503, "raise", "raise", 503, 503)),
    (errors.CompletionError, ("raise", "sent", "sent", "raise", "raise")),
    (Exception, ("raise",) * 5),  # the endpoint's own, and every other library error
]


def _every_error_type() -> list[type[BaseException]]:
    found = [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.IdempotencyError)
    ]
    return [*found, ValueError, RuntimeError]


def _instance(cls: type[BaseException]) -> BaseException:
    # Every keyword any of the library's errors takes; each keeps those it declares.
    given: dict[str, Any] = {
        "key": "k",
        "retry_after": 3.0,
        "lease_end": None,
        "reason": "HTTP 201: too large",
        "result": None,
        "sqlstate": "40001",
        "size": 2,
        "limit": 1,
        "name": "n",
        "path": None,
        "error_type": "orders:CardDeclined",
        "error_message": "declined",
        "data": None,
        # Recovery points (steps).
        "position": 0,
        "recorded": "charge",
        "asked": "refund",
        "step": "charge",
    }
    init = next(base.__init__ for base in cls.__mro__ if "__init__" in vars(base))
    if init is object.__init__ or not issubclass(cls, errors.IdempotencyError):
        return cls("boom")
    try:
        parameters = inspect.signature(init).parameters
    except ValueError:  # a builtin __init__ (Exception's): the message only
        return cls("boom")
    return cls("boom", **{name: value for name, value in given.items() if name in parameters})


def _expected(cls: type[BaseException], stage: Stage) -> int | str:
    column = list(Stage).index(stage)
    for base, answers in EXPECTED:
        if issubclass(cls, base):
            return answers[column]
    raise AssertionError(f"{cls} is not an Exception")


def _rules() -> HttpIdempotency:
    return HttpIdempotency(
        Manager(MemoryStore()), HttpSettings(request_timeout=7.0, caller_scope=lambda r: "c")
    )


@pytest.mark.parametrize("stage", list(Stage), ids=lambda stage: stage.name)
@pytest.mark.parametrize("cls", _every_error_type(), ids=lambda cls: cls.__name__)
def test_every_error_at_every_stage_gets_its_answer(cls: type[BaseException], stage: Stage) -> None:
    error = _instance(cls)
    expected = _expected(cls, stage)
    answer = decide(error, stage)
    if expected == "raise":
        assert answer is Answer.RAISE
        return
    assert answer is not Answer.RAISE
    response = respond(answer, error, _rules())
    if expected == "sent":
        assert response is None
    else:
        assert response is not None and response.status == expected
        assert b"boom" not in response.body  # the error's own words are the operator's


def test_the_table_names_only_library_errors_and_every_stage() -> None:
    for cls, row in TABLE.items():
        assert issubclass(cls, errors.IdempotencyError)
        assert set(row) == set(Stage)


def test_a_timeout_is_told_apart_from_a_rollback_by_stage() -> None:
    rules = _rules()
    error = errors.DeadlineExceededError("late", key="k")
    claimed = respond(decide(error, Stage.CLAIMING), error, rules)
    rolled_back = respond(decide(error, Stage.IN_TRANSACTION), error, rules)
    assert claimed is not None and rolled_back is not None
    # Lease mode: the key stays in progress until the lease ends; retry after the timeout.
    assert dict(claimed.headers)["retry-after"] == "7"
    assert b"stays in progress" in claimed.body
    # Transactional: nothing committed, retry at once.
    assert dict(rolled_back.headers)["retry-after"] == "1"
    assert b"rolled back" in rolled_back.body
