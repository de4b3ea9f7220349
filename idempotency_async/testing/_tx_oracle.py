"""The oracle of transactional scenarios: exactly once for the database effect.

It judges from what committed (the record rows, the effect rows, the callers' own
writes) and what each caller got, with no judgement of the library's: each callback
writes one effect row naming itself and returns its own name, so

- E1 every key with a committed record has exactly one committed effect row, the
  record's run's; a key without one has none; no record stays in progress (T6);
- E2 the committed run is a run whose callback returned and whose COMMIT was not refused;
- E3 a caller that got a result got its own run's (then, if it committed, that run is
  the record's) or a replay of the committed run's — never an uncommitted result (T7), a
  result its snapshot could not see (T2), nor somebody else's after running its own;
- G5 an outcome is a value, the caller's own exception, a refusal or lock timeout, a
  deadlock, ``CancelledError`` only when cancelled, ``DeadlineExceededError`` only with a
  timeout, a serialization failure only under snapshot isolation (T2), a store or
  completion error only when the scenario killed the connection;
- T4 a lock wait is bounded (immediate with ``wait`` off), and after a refusal, a lock
  timeout, a cutoff or its own callback's exception the caller's transaction still
  commits its own writes (only the library's savepoint was rolled back);
- T1 a caller's own write before the call committed exactly when its COMMIT did, and
  its ``lock_timeout`` is its own again after the call;
- T6 misuse cannot commit half a call: a COMMIT is refused (the guard's SQLSTATE) only for
  a caller whose call did not finish, and then nothing of it committed; a rollback to a
  savepoint taken before the call takes the call with it; a second call in the same
  transaction replays the first (same key) or runs once (its own key); a session bound to
  two engines is refused before any statement;
- G4 no call waits past its deadline: a call with a timeout ends within it, plus the
  bounded cleanup after it (the completion reserve, an undo: 1 s in all), plus the
  tolerance (asyncpg callers: psycopg's own cancellation protocol waits for the server).

Lease-mode callers of the same keys (``mode="lease"``) are judged the same way: their
effect is one autocommit statement, committed with their record.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

from idempotency_async import errors
from idempotency_async.testing._tx_run import (
    CALLER_LOCK_TIMEOUT,
    OTHER_KEY,
    TxCallbackFailed,
    TxOutcome,
    TxTrace,
)
from idempotency_async.testing._tx_scenario import TxCallPlan

__all__ = ["check_transactional"]

_REFUSED_COMMIT = "IA001"  # the guard's SQLSTATE, as documented (not imported: independent)
_AFTER_DEADLINE = 1.0  # the bounded work after a deadline: completion reserve, an undo

# Faults after which the caller does not commit on purpose, or cannot.
_NO_COMMIT = (
    "rollback_after_return",
    "kill_backend",
    "close_socket",
    "commit_unanswered",
    "commit_fails",
    "cancel",
    "callback_commits",  # the callback's COMMIT (refused) ended the transaction
)


def check_transactional(trace: TxTrace, *, tolerance: float) -> list[str]:
    """The violations ``trace`` shows (empty: the scenario kept the guarantee)."""
    scenario = trace.scenario
    found: list[str] = []
    by_writer = {outcome.writer: outcome for outcome in trace.outcomes}
    # A second call of a key of its own (again_other_key): its run's writer and key index.
    others = {
        outcome.second_writer: outcome
        for outcome in trace.outcomes
        if outcome.second_writer is not None
    }
    by_writer.update(others)
    committed: dict[int, str] = {}
    for key, status, response in trace.records:
        if status != "COMPLETED":
            found.append(f"T6: record {key!r} committed as {status}")
            continue
        writer = json.loads(response) if response is not None else None
        outcome = by_writer.get(writer) if isinstance(writer, str) else None
        if outcome is None or not isinstance(writer, str):
            found.append(f"E1: record {key!r} holds {response!r}, which no callback returned")
            continue
        index = scenario.calls[outcome.call].key
        if writer in others:
            index = OTHER_KEY + outcome.call
        if index in committed:
            found.append(f"E1: key {index} has two records ({committed[index]}, {writer})")
        committed[index] = writer
    effects: dict[int, list[str]] = defaultdict(list)
    for index, writer in trace.effects:
        effects[index].append(writer)
    for index in sorted({call.key for call in scenario.calls} | set(effects)):
        written = sorted(effects.get(index, []))
        if index in committed and written != [committed[index]]:
            found.append(
                f"E1: key {index}: the record is {committed[index]}'s run, effects committed "
                f"by {written}"
            )
        elif index not in committed and written:
            found.append(f"E1: key {index}: no committed record, effects committed by {written}")
    for index, writer in committed.items():
        outcome = by_writer[writer]
        # The first call's run, or a second call's run of the same caller (its own key, or
        # the same key after the first call's run was undone): did it return?
        second_returned = outcome.second_ran and outcome.second_value == writer
        returned = second_returned if writer in others else outcome.returned or second_returned
        if not returned or outcome.committed is False or outcome.undone:
            found.append(
                f"E2: key {index}: the record is call {outcome.call}'s, whose callback "
                f"{'returned' if returned else 'did not return'} and whose transaction "
                f"did not commit ({outcome.commit_error or outcome.error!r})"
            )
    for outcome in trace.outcomes:
        found += _caller(trace, outcome.call, committed, tolerance)
    found += [f"G4: call {index} never finished" for index in trace.unfinished]
    return found


def _abandoned_at_deadline(outcome: TxOutcome, plan: TxCallPlan) -> bool:
    """A completion abandoned at the call's deadline: ``CompletionError`` with its outcome
    unknown, after the call lasted at least its timeout (a completion is abandoned at the
    deadline or later, never before)."""
    error = outcome.error
    return (
        isinstance(error, errors.CompletionError)
        and error.outcome_unknown
        and plan.timeout is not None
        and (outcome.exited or 0.0) - (outcome.entered or 0.0) >= plan.timeout
    )


def _caller(trace: TxTrace, index: int, committed: dict[int, str], tolerance: float) -> list[str]:
    found: list[str] = []
    outcome = trace.outcomes[index]
    plan = trace.scenario.calls[index]
    manager = trace.scenario.managers[plan.manager]
    key = plan.key
    error = outcome.error
    ran_and_committed = outcome.committed is True and not outcome.undone
    found += _misuse(outcome, plan, committed, tolerance)
    if outcome.two_engines:
        if not isinstance(error, errors.ConfigError):
            found.append(
                f"T10: call {index} on a session of two engines got {error or outcome.value!r}"
            )
        return found
    if outcome.returned_value:
        value = outcome.value
        if value == outcome.writer:
            if ran_and_committed and committed.get(key) != outcome.writer:
                found.append(
                    f"E1: call {index} committed its run of key {key}, but the record is "
                    f"{committed.get(key)}'s"
                )
        elif value != committed.get(key):
            found.append(
                f"E3: call {index} got {value!r} for key {key}; the committed run is "
                f"{committed.get(key)}'s"
            )
        elif outcome.ran:
            found.append(f"E3: call {index} ran its callback, then got {value!r}")
    elif isinstance(error, asyncio.CancelledError):
        if not outcome.cancel_requested:
            found.append(f"G5: call {index} got CancelledError without being cancelled")
    elif error is not None and error is outcome.raised:
        pass  # its own callback's exception (or its own statement's failure)
    elif isinstance(error, TxCallbackFailed):
        found.append(f"G5: call {index} got a callback's exception it did not raise {error!r}")
    elif isinstance(error, errors.DeadlineExceededError):
        if plan.timeout is None:
            found.append(f"G5: call {index} had no timeout but got {error!r}")
    elif isinstance(error, errors.SerializationFailureError):
        if plan.isolation == "read_committed":
            found.append(f"T2: call {index} under READ COMMITTED got {error!r}")
    elif isinstance(error, errors.PersistenceError | errors.CompletionError):
        # The server and the connection are fine unless the scenario killed the backend —
        # or the call's own deadline passed while its completion was on the wire: then it
        # was abandoned (documented: its outcome is unknown).  Judged by what happened (the
        # call lasted its whole timeout), never by how loaded the machine was.
        if plan.fault != "kill_backend" and not _abandoned_at_deadline(outcome, plan):
            found.append(f"G5: call {index} got {type(error).__name__}: {error}")
    elif error is not None and not isinstance(
        error, errors.AlreadyInProgressError | errors.DeadlockDetectedError
    ):
        found.append(f"G5: call {index} got {type(error).__name__}: {error}")
    elapsed = (outcome.exited or 0.0) - (outcome.entered or 0.0)
    if isinstance(error, errors.AlreadyInProgressError):
        bound = manager.wait_timeout if manager.wait else 0.0
        if plan.timeout is not None:
            bound = min(bound, plan.timeout)
        if elapsed > bound + tolerance:
            found.append(
                f"T4: call {index} waited {elapsed:.3f} s for the row (wait={manager.wait}, "
                f"bound {bound:.3f} s) before {type(error).__name__}"
            )
        if isinstance(error, errors.LockTimeoutError) and manager.wait:
            floor = 0.5 * manager.wait_timeout
            if plan.timeout is not None:
                floor = min(floor, 0.5 * plan.timeout)
            if elapsed < floor - 0.01:
                found.append(
                    f"T4: call {index} gave up its lock wait after {elapsed:.3f} s "
                    f"(wait_timeout {manager.wait_timeout}, timeout {plan.timeout})"
                )
    usable_errors = (
        TxCallbackFailed,
        errors.AlreadyInProgressError,
        errors.DeadlineExceededError,
    )
    usable = isinstance(error, usable_errors)
    # A second call that spoiled the transaction made the caller roll back.
    second = outcome.second_error
    spoiled = second is not None and not isinstance(second, usable_errors)
    # Under SERIALIZABLE a COMMIT may be refused as a serialization failure on its own.
    refused = plan.isolation == "serializable" and outcome.commit_state == "40001"
    if (
        usable
        and plan.fault not in _NO_COMMIT
        and outcome.committed is not True
        and not refused
        and not spoiled
    ):
        found.append(
            f"T4: after {type(error).__name__} call {index}'s own transaction did not commit "
            f"({outcome.commit_error})"
        )
    if outcome.lock_timeout is not None and outcome.lock_timeout != CALLER_LOCK_TIMEOUT:
        found.append(
            f"T1: after call {index} the transaction's lock_timeout is {outcome.lock_timeout} "
            f"(the caller set {CALLER_LOCK_TIMEOUT})"
        )
    # (psycopg waits for the server to acknowledge a cancelled statement, up to 5 s by its
    # own rule, before the statement returns: that wait is the driver's, not a lock's, and
    # grows with the machine's load, so psycopg callers are not judged by elapsed time.)
    if plan.timeout is not None and plan.mode == "transaction" and plan.driver == "asyncpg":
        bound = plan.timeout + _AFTER_DEADLINE + tolerance
        if elapsed > bound:
            found.append(
                f"G4: call {index} took {elapsed:.3f} s, past its timeout {plan.timeout} and "
                f"the bounded work after it ({_AFTER_DEADLINE} s + tolerance {tolerance})"
            )
    if outcome.committed is True and outcome.writer not in trace.attempts:
        found.append(f"T1: call {index} committed, but its own write before the call is gone")
    if outcome.committed is False and outcome.writer in trace.attempts:
        found.append(f"T1: call {index} did not commit, but its own write is there")
    return found


def _misuse(
    outcome: TxOutcome, plan: TxCallPlan, committed: dict[int, str], tolerance: float
) -> list[str]:
    """The checks of a caller's misuse: refused COMMITs, second calls."""
    found: list[str] = []
    index = outcome.call
    if outcome.commit_state == _REFUSED_COMMIT and not outcome.cancel_requested:
        found.append(
            f"T6: call {index}'s COMMIT was refused as holding an unfinished claim, but the "
            f"call finished ({outcome.error or outcome.value!r})"
        )
    if plan.fault not in ("again_same_key", "again_other_key"):
        return found
    error = outcome.second_error
    if plan.fault == "again_same_key":
        writer, key = outcome.writer, plan.key
    else:
        writer, key = outcome.second_writer or "", OTHER_KEY + index
    if outcome.second_returned:
        value = outcome.second_value
        first_ran = outcome.returned_value and outcome.value == outcome.writer
        if value == writer:
            if plan.fault == "again_same_key" and first_ran and outcome.second_ran:
                found.append(f"E3: call {index} ran key {key} twice in one transaction")
            if outcome.committed is True and not outcome.undone and committed.get(key) != writer:
                found.append(
                    f"E1: call {index} committed its second call of key {key}, but the "
                    f"record is {committed.get(key)}'s"
                )
        elif value != committed.get(key) or first_ran or outcome.second_ran:
            found.append(
                f"E3: call {index}'s second call (key {key}) got {value!r}; its own run is "
                f"{writer!r}, the committed one {committed.get(key)!r}"
            )
    elif isinstance(error, TxCallbackFailed):
        if error is not outcome.second_raised:
            found.append(f"G5: call {index}'s second call got a callback exception not its own")
    elif isinstance(error, errors.DeadlineExceededError):
        if plan.timeout is None:
            found.append(f"G5: call {index}'s second call had no timeout but got {error!r}")
    elif isinstance(error, errors.SerializationFailureError):
        if plan.isolation == "read_committed":
            found.append(f"T2: call {index}'s second call under READ COMMITTED got {error!r}")
    elif isinstance(error, errors.AlreadyInProgressError):
        pass  # (another caller's open transaction holds the key: same key only)
    elif error is not None and error is not outcome.second_raised:
        found.append(f"G5: call {index}'s second call got {type(error).__name__}: {error}")
    return found
