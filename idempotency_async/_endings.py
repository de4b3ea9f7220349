"""How a call ends: one pure table from how the callback ended to what is written and raised.

The lifecycle asks :func:`decide` once the callback is over, with four facts: how the
callback ended (:class:`Ended`), whether its own cutoff fired, whether its caller was
cancelled meanwhile, and what the callback said through its ``Call`` (:class:`Answer`).
The answer (:class:`Decision`) is what to write — nothing, leave the record to its lease,
release, complete — and what the caller gets.  No I/O here: ``tests/test_endings.py``
enumerates every row.

The rules, in the order they apply:

- A ``BaseException`` that is not an ``Exception`` (``SystemExit``, a test framework's
  failure) is a crash: nothing is written, it propagates.
- A callback that returned something not awaitable has run (a plain function): the record
  completes without a response, unless the call completed it already or asked for its
  release; the caller gets ``ConfigError``.
- Once completed through its ``Call``, nothing undoes the record: the callback's outcome
  goes to the caller as it is (a ``CancelledError`` too).
- Its own cutoff (the ``CancelledError`` was the cutoff's): nothing is written — the
  record waits for its lease (a transactional call undoes its claim instead) — and the
  caller gets ``DeadlineExceededError``.
- After its caller was cancelled, a call writes nothing (G6) and raises ``CancelledError``
  (the one it got, or a new one from whatever the callback turned it into).
- A callback that raised an error its caller declared a result (``replay_errors``) and
  was not cut off completes the record with that error, which propagates: its duplicates
  get it raised again.  Cut off (the error may be how it took the cutoff) or after
  ``Call.release``, it is released like any other exception.
- Otherwise a callback that raised (or raised its own ``CancelledError``) releases the key
  and its exception propagates; one that returned completes the record, or releases it if
  it asked to (``Call.release``), and its value goes to the caller.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

__all__ = ["Answer", "Decision", "Ended", "Outcome", "Write", "decide"]


class Ended(Enum):
    """How the callback ended."""

    RETURNED = "returned"
    RAISED = "raised"
    """An ``Exception``."""
    DECLARED = "declared"
    """An ``Exception`` declared a result (``replay_errors``): a deterministic failure."""
    CANCELLED = "cancelled"
    """A ``CancelledError`` (its cutoff's, its caller's, or its own)."""
    NOT_AWAITABLE = "not awaitable"
    """It returned something that cannot be awaited: a plain function, which has run."""
    CRASHED = "crashed"
    """A ``BaseException`` that is not an ``Exception``."""


class Answer(Enum):
    """What the callback said through its ``Call`` (``execute``'s callbacks say nothing)."""

    NONE = "none"
    COMPLETED = "completed"
    """It completed the record (``Call.complete``): its point of no return."""
    RELEASE = "release"
    """It asked for the key to be released when it returns (``Call.release``)."""


class Write(Enum):
    """What is written to the store after the callback."""

    NOTHING = "nothing"
    ABANDON = "abandon"
    """Nothing; the record waits for its lease (a transactional call undoes its claim)."""
    RELEASE = "release"
    COMPLETE = "complete"
    COMPLETE_NOT_STORED = "complete not stored"
    """Complete the record without a response."""
    COMPLETE_ERROR = "complete error"
    """Complete the record with the declared error the callback raised."""


class Outcome(Enum):
    """What the caller gets."""

    RESULT = "result"
    """The callback's return value."""
    OWN = "own"
    """The callback's exception (or the CancelledError) as it is."""
    CANCELLED = "cancelled"
    """``CancelledError``: the caller was cancelled."""
    CUT_OFF = "cut off"
    """``DeadlineExceededError``."""
    NOT_AWAITABLE = "not awaitable"
    """``ConfigError``: the callback was not an async callable."""


class Decision(NamedTuple):
    write: Write
    outcome: Outcome


# The decisions, made once: ``decide`` hands back these objects.
_CRASH = Decision(Write.NOTHING, Outcome.OWN)
_ABANDON = Decision(Write.ABANDON, Outcome.CUT_OFF)
_PROPAGATE = Decision(Write.NOTHING, Outcome.OWN)
_RELEASE_AND_RAISE = Decision(Write.RELEASE, Outcome.OWN)
_CANCELLED = Decision(Write.NOTHING, Outcome.CANCELLED)
_COMPLETE_AND_RAISE = Decision(Write.COMPLETE_ERROR, Outcome.OWN)
_RETURN = Decision(Write.NOTHING, Outcome.RESULT)
_RELEASE_AND_RETURN = Decision(Write.RELEASE, Outcome.RESULT)
COMPLETE = Decision(Write.COMPLETE, Outcome.RESULT)
"""The decision of the uncontended path: the callback returned, nothing else happened."""
_NOT_AWAITABLE = {
    Answer.NONE: Decision(Write.COMPLETE_NOT_STORED, Outcome.NOT_AWAITABLE),
    Answer.COMPLETED: Decision(Write.NOTHING, Outcome.NOT_AWAITABLE),
    Answer.RELEASE: Decision(Write.RELEASE, Outcome.NOT_AWAITABLE),
}

_RETURNED, _RAISED, _DECLARED, _CANCELLED_END, _NOT_AWAITABLE_END, _CRASHED = (
    Ended.RETURNED,
    Ended.RAISED,
    Ended.DECLARED,
    Ended.CANCELLED,
    Ended.NOT_AWAITABLE,
    Ended.CRASHED,
)
_NONE, _COMPLETED, _RELEASE = Answer.NONE, Answer.COMPLETED, Answer.RELEASE


def decide(ended: Ended, cut_off: bool, caller_cancelled: bool, answer: Answer) -> Decision:
    """What to write and what to raise when the callback ended as ``ended``.

    ``cut_off``: the call's own cutoff fired (the CancelledError was ours).
    ``caller_cancelled``: the calling task was asked to cancel since the callback started.
    """
    if ended is _RETURNED and answer is _NONE and not caller_cancelled:
        return COMPLETE  # the uncontended path, asked first
    if ended is _CRASHED:
        return _CRASH
    if ended is _NOT_AWAITABLE_END:
        return _NOT_AWAITABLE[answer]
    if ended is _CANCELLED_END:
        if answer is _COMPLETED:
            return _PROPAGATE  # past its point of no return
        if cut_off:
            return _ABANDON  # (a cutoff that fired wins over the caller's cancellation)
        if caller_cancelled:
            return _PROPAGATE
        return _RELEASE_AND_RAISE  # a CancelledError the callback raised on its own
    if caller_cancelled:
        return _CANCELLED  # no store write after a cancellation (G6)
    if answer is _COMPLETED:
        return _RETURN if ended is _RETURNED else _PROPAGATE
    if ended is _DECLARED:
        return _COMPLETE_AND_RAISE if answer is _NONE and not cut_off else _RELEASE_AND_RAISE
    if ended is _RAISED:
        return _RELEASE_AND_RAISE
    return _RELEASE_AND_RETURN if answer is _RELEASE else COMPLETE
