"""The decision table of how a call ends (``_endings.decide``), every row.

The expected table is written out here, row by row, from the guarantee: G2 (no way back
after the point of no return), G5 (documented outcomes only: ``CancelledError`` only when
the caller was cancelled, ``DeadlineExceededError`` only for its own cutoff) and G6 (no
store write after a cancellation).  ``*`` matches any value; every combination of the four
inputs must match exactly one row, so the table is total and has no overlaps.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from idempotency_async._endings import Answer, Decision, Ended, Outcome, Write, decide

ANY: Any = "*"

R, X, D, C, N, B = (
    Ended.RETURNED,
    Ended.RAISED,
    Ended.DECLARED,
    Ended.CANCELLED,
    Ended.NOT_AWAITABLE,
    Ended.CRASHED,
)
NONE, DONE, GIVE_BACK = Answer.NONE, Answer.COMPLETED, Answer.RELEASE

# (how it ended, cutoff fired, caller cancelled, what the Call said) -> (write, outcome)
TABLE: list[tuple[tuple[Any, Any, Any, Any], tuple[Write, Outcome]]] = [
    # A crash (SystemExit, a test framework's failure): no write, it propagates.
    ((B, ANY, ANY, ANY), (Write.NOTHING, Outcome.OWN)),
    # A plain function ran: completed without a response, unless already answered.
    ((N, ANY, ANY, NONE), (Write.COMPLETE_NOT_STORED, Outcome.NOT_AWAITABLE)),
    ((N, ANY, ANY, DONE), (Write.NOTHING, Outcome.NOT_AWAITABLE)),
    ((N, ANY, ANY, GIVE_BACK), (Write.RELEASE, Outcome.NOT_AWAITABLE)),
    # Cancelled after the point of no return: the record stays completed.
    ((C, ANY, ANY, DONE), (Write.NOTHING, Outcome.OWN)),
    # Its own cutoff: nothing written, DeadlineExceededError.
    ((C, True, ANY, NONE), (Write.ABANDON, Outcome.CUT_OFF)),
    ((C, True, ANY, GIVE_BACK), (Write.ABANDON, Outcome.CUT_OFF)),
    # Its caller's cancellation: nothing written, the CancelledError propagates.
    ((C, False, True, NONE), (Write.NOTHING, Outcome.OWN)),
    ((C, False, True, GIVE_BACK), (Write.NOTHING, Outcome.OWN)),
    # A CancelledError the callback raised on its own is its own exception: released.
    ((C, False, False, NONE), (Write.RELEASE, Outcome.OWN)),
    ((C, False, False, GIVE_BACK), (Write.RELEASE, Outcome.OWN)),
    # Raised or returned after the caller was cancelled: no write, CancelledError.
    ((X, ANY, True, ANY), (Write.NOTHING, Outcome.CANCELLED)),
    ((R, ANY, True, ANY), (Write.NOTHING, Outcome.CANCELLED)),
    ((D, ANY, True, ANY), (Write.NOTHING, Outcome.CANCELLED)),
    # Raised: released before the point of no return, left completed after it.
    ((X, ANY, False, NONE), (Write.RELEASE, Outcome.OWN)),
    ((X, ANY, False, GIVE_BACK), (Write.RELEASE, Outcome.OWN)),
    ((X, ANY, False, DONE), (Write.NOTHING, Outcome.OWN)),
    # Raised a declared error (replay_errors): completed with it, so duplicates get it
    # again — unless cut off (it may be how the callback took its cutoff) or the Call asked
    # for a release; left completed after the point of no return.
    ((D, False, False, NONE), (Write.COMPLETE_ERROR, Outcome.OWN)),
    ((D, True, False, NONE), (Write.RELEASE, Outcome.OWN)),
    ((D, ANY, False, GIVE_BACK), (Write.RELEASE, Outcome.OWN)),
    ((D, ANY, False, DONE), (Write.NOTHING, Outcome.OWN)),
    # Returned: completed, or left as the Call completed it, or released on request.
    ((R, ANY, False, NONE), (Write.COMPLETE, Outcome.RESULT)),
    ((R, ANY, False, DONE), (Write.NOTHING, Outcome.RESULT)),
    ((R, ANY, False, GIVE_BACK), (Write.RELEASE, Outcome.RESULT)),
]

CASES = list(itertools.product(Ended, (False, True), (False, True), Answer))


def _matches(pattern: tuple[Any, ...], case: tuple[Any, ...]) -> bool:
    return all(want in (ANY, got) for want, got in zip(pattern, case, strict=True))


def test_the_table_covers_every_case_once() -> None:
    assert len(CASES) == 72
    for case in CASES:
        rows = [row for row, _ in TABLE if _matches(row, case)]
        assert len(rows) == 1, (case, rows)


@pytest.mark.parametrize(
    "case", CASES, ids=["-".join(str(getattr(v, "value", v)) for v in c) for c in CASES]
)
def test_every_row(case: tuple[Ended, bool, bool, Answer]) -> None:
    (expected,) = [decision for row, decision in TABLE if _matches(row, case)]
    assert decide(*case) == Decision(*expected)


def test_no_write_follows_a_cancellation_of_the_caller() -> None:
    # G6 read off the table: whatever the callback did, a cancelled caller writes nothing
    # — unless its own cutoff fired first (then nothing is written either).
    for ended, cut_off, answer in itertools.product(Ended, (False, True), Answer):
        write = decide(ended, cut_off, True, answer).write
        if ended is not Ended.NOT_AWAITABLE:
            assert write in (Write.NOTHING, Write.ABANDON), (ended, cut_off, answer)


def test_nothing_undoes_a_completed_call() -> None:
    # G2 read off the table: after Call.complete, never a release.
    for ended, cut_off, cancelled in itertools.product(Ended, (False, True), (False, True)):
        assert decide(ended, cut_off, cancelled, Answer.COMPLETED).write is Write.NOTHING


def test_only_a_declared_error_completes_with_an_error() -> None:
    # Write.COMPLETE_ERROR is reached from one row only: declared, not cut off, the caller
    # not cancelled, nothing said through the Call.
    rows = [case for case in CASES if decide(*case).write is Write.COMPLETE_ERROR]
    assert rows == [(Ended.DECLARED, False, False, Answer.NONE)]
