"""Recovery points: named steps inside one idempotent call, recorded as they finish.

``await step("charge", lambda: charge(order))`` inside a callback runs the function and
records its result on the key's record before the next step starts.  A retry of the same
key after a crash or a failed step replays the recorded steps' results without running
them, and runs the first step that has none; the final result completes the key as
always.  See ``docs/steps.md``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from idempotency_async._steps import MAX_STEP_NAME, MAX_STEPS, run_step

__all__ = ["MAX_STEPS", "MAX_STEP_NAME", "step"]

T = TypeVar("T")


def step(name: str, fn: Callable[[], Awaitable[T]], *, connection: Any = None) -> Awaitable[T]:
    """Run ``fn`` as the step ``name`` of the running idempotent call, once.

    The first time the call reaches ``name``, ``fn()`` runs and its result (a JSON value)
    is recorded on the record — one owner-fenced store write — before this returns it.  A
    later run of the same key (after a crash, or after the callback raised) that reaches
    the same step gets the recorded result without ``fn`` running.  A step that raises
    records nothing: the exception propagates, and a retry runs the step again.

    Steps of one call run one at a time, in the same order on every run; names are unique
    within a call (at most :data:`MAX_STEP_NAME` characters; at most :data:`MAX_STEPS`
    steps).  A downstream key derived inside a step is scoped by the step's name.  In a
    call run without idempotency (no key, or disabled) and in ``execute_in_transaction``
    the function runs and nothing is recorded.

    ``connection`` makes it a *transactional step* (``PostgresStore``): an asyncpg or
    psycopg 3 connection, or a SQLAlchemy ``AsyncConnection`` / ``AsyncSession``, that is
    not in a transaction.  The step opens one on it, runs ``fn`` (whose writes go through
    that connection), writes the recovery point through it and commits: the writes and
    the recovery point commit together or not at all.  A step that raises rolls it back.

    :raises ~idempotency_async.errors.StepMismatchError: the record holds another step at
        this position; ``fn`` did not run.
    :raises ~idempotency_async.errors.StepResultNotStoredError: the step ran (now or
        before) but its result could not be stored; it does not run again.
    :raises ~idempotency_async.errors.StepNotRecordedError: the step ran but its write
        failed; the key is left to its lease.
    :raises ~idempotency_async.errors.LeaseLostError: another worker holds the key now.
    :raises ~idempotency_async.errors.ConfigError: outside a running call, after
        ``Call.complete``, a bad or repeated name, a step inside a running step, after a
        step whose recovery point was not recorded (its error caught), a store that does
        not record steps, or ``connection`` on a store other than ``PostgresStore`` or on
        a connection already in a transaction — before ``fn`` runs.

    .. versionadded:: 0.2.0
    """
    return run_step(name, fn, connection)
