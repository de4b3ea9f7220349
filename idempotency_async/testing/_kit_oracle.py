"""The test kit's oracle: the lease-mode guarantee, judged with the user's effect counter.

Lease mode promises at most one run of the handler's effect per lease, and the effect
once when nothing crashed (a crash after the effect and before the completion re-runs it
once the lease has ended).  From a trace (the counter read at every store request) it
checks, each violation a line starting with the name of what was broken:

- ``effect before the claim``: the counter moved between a call's start and its claim
  (the effect runs outside the idempotent call: every duplicate repeats it);
- ``effect without a claim``: a call made the effect and never claimed (no key found?);
- ``effect after cancellation``: the handler went on to its effect after its task was
  cancelled (it swallows ``CancelledError``);
- ``more effects than runs``: more effects than runs that held the key;
- ``effect repeated``: a second run made the effect although no earlier run with an effect
  crashed or lost its completion (e.g. the handler raised after its effect: the key was
  released and the retry did it again);
- ``different answers``: duplicates of one payload got different answers;
- ``stuck key``: a call after every lease had ended was still told "in progress".
- ``effect repeated downstream`` (``check_handler(downstream=True)``): the counter, of
  what a provider deduplicating by key applied, moved twice for one key.

A handler that takes steps (recovery points) makes several effects per run: it is judged
per step instead of per run (``_kit_step_oracle``), with the checks above that do not
count effects per run.

A transactional HTTP route that returns a response without running its transaction is
reported first (``transaction not run``, from the library's own error).  A handler whose
calls are all transactional (``execute_in_transaction``) is judged by
transactional mode instead: its database effect commits exactly once per key
(``effect committed twice``, ``effect never committed``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

from idempotency_async import errors
from idempotency_async.record import Status
from idempotency_async.testing._kit_run import Mark, Outcome, Trace
from idempotency_async.testing._kit_step_oracle import is_stepped, judge_steps
from idempotency_async.testing._kit_targets import HttpAnswer

__all__ = ["describe", "judge", "kind_of", "normal"]


def kind_of(outcome: Outcome) -> str:
    """``answer``, ``in progress``, ``mismatch``, ``crashed`` or ``error``."""
    if outcome.crashed:
        return "crashed"
    if outcome.error is not None:
        if isinstance(outcome.error, errors.AlreadyInProgressError):
            return "in progress"
        if isinstance(outcome.error, errors.PayloadValidationError):
            return "mismatch"
        return "error"
    answer = outcome.answer
    if isinstance(answer, HttpAnswer):
        if answer.status == 409:
            return "in progress"
        if answer.status == 422:
            return "mismatch"
        return "answer" if answer.status < 400 else "error"
    return "answer"


def describe(outcome: Outcome) -> str:
    if outcome.crashed:
        return f"cancelled at await #{outcome.steps}"
    if outcome.error is not None:
        return f"raised {type(outcome.error).__name__}: {outcome.error}"[:200]
    return f"returned {outcome.answer!r}"[:200]


def judge(trace: Trace) -> list[str]:
    if trace.error is not None:
        return [f"run failed: {type(trace.error).__name__}: {trace.error}"]
    violations: list[str] = _transaction_not_run(trace)
    if violations:
        return violations
    marks = trace.marks
    total = marks[-1].count - marks[0].count
    if trace.transactional:
        return _transactional(trace, total) + _answers(trace)
    violations += _before_claim(trace)
    if is_stepped(trace):
        # Several effects per run, judged per step (``_kit_step_oracle``).
        violations += _after_cancel(trace)
        violations += judge_steps(trace)
        return violations + _answers(trace) + _stuck(trace)
    runs = [mark for mark in marks if mark.what == "claimed"]
    if total > len(runs) and not violations:
        violations.append(
            f"more effects than runs: the counter moved {total} times, but only {len(runs)} "
            "run(s) held the key (an effect outside the idempotent call, or one the handler "
            "repeats within a run)"
        )
    violations += _after_cancel(trace)
    if trace.downstream and total > 1 and not violations:
        violations.append(
            f"effect repeated downstream: the provider applied {total} effects for one key "
            "(with downstream keys every run sends the provider the same key, so a re-run after "
            "a crash or a failed completion is deduplicated there: is the key it gets derived "
            "with downstream_key, the same on every run?)"
        )
    violations += _repeated(trace, total, runs)
    violations += _answers(trace)
    violations += _stuck(trace)
    return violations


def _transaction_not_run(trace: Trace) -> list[str]:
    for message in trace.logs:
        if "without running its transaction" in message:
            return [
                "transaction not run: " + message.split(": nothing was recorded")[0] + " (the "
                "library answered 500 instead; nothing was recorded, so every retry runs the "
                "endpoint again)"
            ]
    return []


def _transactional(trace: Trace, total: int) -> list[str]:
    """Transactional mode: the database effect commits exactly once per key (a crash rolls
    it back with the record, and the retry runs once)."""
    if total > 1:
        return [
            f"effect committed twice: the counter moved {total} times for one key in "
            "transactional mode (an effect made outside the call's transaction — another "
            "connection, an autocommit write, a provider call — is not rolled back with the "
            "record: a crash before the COMMIT and a retry repeat it)"
        ]
    answered = any(kind_of(outcome) == "answer" for outcome in trace.outcomes)
    if total == 0 and answered:
        return [
            "effect never committed: a call answered, but the counter did not move (does the "
            "handler commit its transaction, and does the counter read committed rows?)"
        ]
    return []


def _before_claim(trace: Trace) -> list[str]:
    found: list[str] = []
    marks = trace.marks
    for index in range(len(trace.scenario.calls)):
        own = [(i, mark) for i, mark in enumerate(marks) if mark.call == index]
        if not own or own[0][1].what != "start":
            continue
        start_at, start = own[0]
        # The first thing the call did after its start, if no other call did anything between.
        following = marks[start_at + 1] if start_at + 1 < len(marks) else None
        if following is None or following.call != index or following.count == start.count:
            continue
        if following.what == "claim sent":
            found.append(
                f"effect before the claim: call {index} moved the effect counter "
                f"({start.count} -> {following.count}) before its claim reached the store "
                "(the effect runs outside the idempotent call, so every duplicate repeats it)"
            )
        elif following.what == "end" and not any(m.what == "claim sent" for _, m in own):
            found.append(
                f"effect without a claim: call {index} moved the effect counter "
                f"({start.count} -> {following.count}) and never claimed a key (is the call "
                "idempotent at all: is the route marked, does the payload carry the key the "
                "key expression selects?)"
            )
    return found[:1]


def _after_cancel(trace: Trace) -> list[str]:
    marks = trace.marks
    for at, mark in enumerate(marks):
        if mark.what != "cancelled":
            continue
        for later in marks[at + 1 :]:
            if later.call != mark.call:
                break  # another call ran meanwhile: the effect is not surely this one's
            if later.what == "claimed":
                # The cancellation was lost before the claim was answered (a store client
                # that finishes a request it was cancelled in): the run that follows is an
                # ordinary one, judged as such.
                break
            if later.what == "end":
                if later.count > mark.count:
                    return [
                        f"effect after cancellation: call {mark.call} was cancelled at its "
                        f"await #{mark.steps} and still made the effect (the handler swallows "
                        "CancelledError and carries on: the key stays held until its lease "
                        "ends, and a retry then repeats the effect)"
                    ]
                break
    return []


def _run_end(trace: Trace, claimed_at: int, claim: Mark) -> tuple[Mark | None, str]:
    """How the run that claimed at ``claimed_at`` ended: its ending mark and a word."""
    for mark in trace.marks[claimed_at + 1 :]:
        if mark.call != claim.call:
            continue
        if mark.what in ("complete sent", "release sent"):
            return mark, mark.what.split()[0]
        if mark.what == "end":
            return mark, "end"
    return None, "end"


def _completed(trace: Trace, owner: str | None) -> bool:
    """Whether the store ever held the owner's record completed."""
    assert trace.store is not None
    for op in trace.store.ops:
        for application in op.applications:
            after = application.after
            if after is not None and after.owner == owner and after.status is Status.COMPLETED:
                return True
    return False


def _repeated(trace: Trace, total: int, runs: list[Mark]) -> list[str]:
    if total <= 1:
        return []
    marks = trace.marks
    effective: list[tuple[Mark, str, bool]] = []
    claims = [(at, mark) for at, mark in enumerate(marks) if mark.what == "claimed"]
    for claimed_at, claim in claims:
        end, how = _run_end(trace, claimed_at, claim)
        if end is None or end.count == claim.count:
            continue
        assert claim.call is not None
        outcome = trace.outcomes[claim.call]
        excused = outcome.crashed or (how == "complete" and not _completed(trace, claim.owner))
        effective.append((claim, how, excused))
    for (claim, how, excused), later in itertools.pairwise(effective):
        if excused:
            continue
        assert claim.call is not None and later[0].call is not None
        outcome = trace.outcomes[claim.call]
        why = (
            "its callback raised after the effect, so the key was released"
            if how == "release"
            else "its record never completed"
        )
        return [
            f"effect repeated: call {claim.call} made the effect and {describe(outcome)}; "
            f"{why}, and call {later[0].call} ran it again (nothing crashed: return a result "
            "once the effect happened, or declare the error a result with replay_errors)"
        ]
    return []


def normal(value: Any) -> str:
    def default(obj: Any) -> Any:
        if hasattr(obj, "model_dump"):
            return obj.model_dump(mode="json")
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.asdict(obj)
        return repr(obj)

    if isinstance(value, HttpAnswer):
        value = (value.status, value.body)
    return json.dumps(value, sort_keys=True, default=default)


def _unrecorded(trace: Trace) -> set[int]:
    """Calls whose run sent a completion the store never applied (G1(c): the answer went
    out, the record did not complete, and a retry after the lease runs again)."""
    return {
        mark.call
        for mark in trace.marks
        if mark.what == "complete sent"
        and mark.call is not None
        and not _completed(trace, mark.owner)
    }


def _answers(trace: Trace) -> list[str]:
    unrecorded = _unrecorded(trace)
    answers = [
        (index, outcome)
        for index, (call, outcome) in enumerate(
            zip(trace.scenario.calls, trace.outcomes, strict=True)
        )
        if not call.variant and kind_of(outcome) == "answer" and index not in unrecorded
    ]
    if not answers:
        return []
    first_index, first = answers[0]
    for index, outcome in answers[1:]:
        if normal(outcome.answer) != normal(first.answer):
            return [
                f"different answers: call {first_index} {describe(first)}, but its duplicate "
                f"call {index} {describe(outcome)} (a result that does not replay as itself?)"
            ]
    return []


def _stuck(trace: Trace) -> list[str]:
    for index, (call, outcome) in enumerate(zip(trace.scenario.calls, trace.outcomes, strict=True)):
        if call.start == "after_lease" and kind_of(outcome) == "in progress":
            return [
                f"stuck key: call {index} started after every lease had ended and was told "
                "the key is in progress (a run that never ends or ignores cancellation?)"
            ]
    return []
