"""The test kit's oracle for handlers that take steps (recovery points), per step.

A run of such a handler makes several effects, one or more per step: the counter may
move several times in one run.  Effects are attributed to the step whose recovery point
the run wrote next (the step's function, and the code before it since the previous
recovery point), or to the run's tail (after its last step).  Checked, each violation a
line starting with the name of what was broken:

- ``step order differs``: a retry asked for another step than the record holds at that
  position (``StepMismatchError``): the handler chooses its steps by time, a counter or
  data that change between runs, and every retry of the key fails until it expires;
- ``effect outside a step``: a resumed run moved the counter while it replayed its
  recorded steps: code between steps runs again on every resume, so an effect there
  repeats although a later recovery point was recorded;
- ``recorded step ran again``: a run wrote the recovery point of a step that an earlier
  run had recorded (the record lost its steps: a store that drops them on a claim);
- ``step repeated``: two runs made a step's effect although the first neither crashed
  nor failed to record it (its function raised after its effect: the key was released
  with its progress kept, and the retry ran the step again at once);
- ``step ran again inside the lease``: the first did crash (or lost its recovery point),
  and the second claimed the key before the first's lease ended;
- ``effect repeated downstream`` (``downstream=True``): a step re-run after a crash sent
  its provider a new key (the provider applied its effect twice).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from idempotency_async import errors
from idempotency_async.testing._kit_run import Mark, Trace

__all__ = ["is_stepped", "judge_steps", "mismatch_of"]

_ENDS = ("complete sent", "release sent", "end")


def is_stepped(trace: Trace) -> bool:
    """Whether the handler took steps in ``trace`` (a recovery point sent or resumed)."""
    return any(
        mark.what == "record_step sent" or (mark.what == "claimed" and mark.detail)
        for mark in trace.marks
    )


@dataclass(slots=True)
class _Run:
    call: int
    claim: Mark
    resumed: tuple[str, ...]
    effects: dict[int | str, int] = field(default_factory=dict)
    """Counter moves per step position (``"tail"``: after the last step)."""
    names: dict[int, str] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)
    """Positions whose recovery point the run does not know written (the write failed,
    its answer was lost, or the run crashed there)."""
    recorded: set[int] = field(default_factory=set)
    written: set[int] = field(default_factory=set)
    """Positions whose recovery point the run sent (it ran their step)."""
    replayed: list[Mark] = field(default_factory=list)
    end: str = "end"
    """How the run ended: ``complete``, ``release`` or ``end`` (neither: left to its lease)."""
    stopped: int | None = None
    """The position the run stopped at without completing (its effects since its last
    recovery point are counted there)."""


def _runs(trace: Trace) -> list[_Run]:
    marks = trace.marks
    runs: list[_Run] = []
    for at, claim in enumerate(marks):
        if claim.what != "claimed" or claim.call is None:
            continue
        run = _Run(claim.call, claim, tuple(claim.detail or ()))
        since, last = claim, 0
        for mark in marks[at + 1 :]:
            if mark.call != claim.call:
                continue
            if mark.what == "step_replayed":
                run.replayed.append(mark)
                since = mark
            elif mark.what == "record_step sent":
                position, names = mark.detail
                last = position
                run.written.add(position)
                if position not in run.effects:
                    run.effects[position] = mark.count - since.count
                    if position < len(names):
                        run.names[position] = names[position]
            elif mark.what == "record_step done":
                (run.recorded if mark.detail else run.failed).add(last)
                since = mark
            elif mark.what == "record_step failed":
                run.failed.add(last)
                since = mark
            elif mark.what in _ENDS:
                run.end = mark.what.split()[0]
                if run.end == "complete":
                    run.effects["tail"] = mark.count - since.count
                else:
                    passed = [p for p in run.effects if isinstance(p, int)]
                    run.stopped = max(passed) + 1 if passed else len(run.replayed)
                    run.effects[run.stopped] = mark.count - since.count
                break
        runs.append(run)
    return runs


def mismatch_of(error: BaseException | None) -> errors.StepMismatchError | None:
    """The ``StepMismatchError`` ``error`` is, or was raised from."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, errors.StepMismatchError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def judge_steps(trace: Trace) -> list[str]:
    found = _mismatch(trace)
    if found:
        return found
    runs = _runs(trace)
    return (_replayed_effects(runs) + _recorded_again(runs) + _repeated(trace, runs))[:1]


def _mismatch(trace: Trace) -> list[str]:
    # The caller's error, or one the door logged and answered for (a batch item failure).
    found = [(f"call {i}", mismatch_of(outcome.error)) for i, outcome in enumerate(trace.outcomes)]
    found += [("a retry", mismatch_of(error)) for error in trace.logged_errors]
    for who, mismatch in found:
        if mismatch is not None:
            return [
                f"step order differs: {who} asked for step {mismatch.asked!r} as step "
                f"{mismatch.position + 1}, where the record holds {mismatch.recorded!r} "
                "(StepMismatchError): the handler chooses its steps by something that changes "
                "between runs — the time, a counter, data — so a retry cannot resume, and "
                "every retry of this key fails until the record expires (name each step the "
                "same on every run, in the same order)"
            ]
    return []


def _replayed_effects(runs: list[_Run]) -> list[str]:
    for run in runs:
        if not run.resumed or not run.replayed:
            continue
        moved = run.replayed[-1].count - run.claim.count
        if moved > 0:
            names = ", ".join(repr(name) for name in run.resumed[: len(run.replayed)])
            return [
                f"effect outside a step: call {run.call} resumed the key and replayed its "
                f"recorded steps ({names}) without running them, yet the effect counter moved "
                f"{moved} time(s) meanwhile ({run.claim.count} -> {run.replayed[-1].count}): "
                "the effect is made by code between steps, which runs again on every resume, "
                "so it ran twice although a later recovery point was recorded (make the effect "
                "inside a step: await step(name, fn))"
            ]
    return []


def _recorded_again(runs: list[_Run]) -> list[str]:
    recorded: dict[int, int] = {}
    for run in runs:
        for position in sorted(run.written):
            if position in recorded:
                name = run.names.get(position, f"#{position + 1}")
                return [
                    f"recorded step ran again: call {run.call} ran step {name!r} (step "
                    f"{position + 1}), which call {recorded[position]} had recorded: the record "
                    "no longer held it (does the store keep a record's steps when a claim takes "
                    "it over?)"
                ]
        for position in run.recorded:
            recorded.setdefault(position, run.call)
    return []


def _repeated(trace: Trace, runs: list[_Run]) -> list[str]:
    positions = sorted(
        {p for run in runs for p in run.effects}, key=lambda p: (isinstance(p, str), p)
    )
    for position in positions:
        made = [run for run in runs if run.effects.get(position, 0) > 0]
        for first, later in itertools.pairwise(made):
            name = "after its last step" if position == "tail" else _step(first, position)
            if trace.downstream:
                return [
                    f"effect repeated downstream: the provider applied the effect of "
                    f"{name} for call {first.call} and again for call {later.call} (a step "
                    "run again after a crash sends its provider the same key only when the key "
                    "is derived with downstream_key inside the step, the same on every run)"
                ]
            outcome = trace.outcomes[first.call]
            excused = (
                outcome.crashed
                or position in first.failed
                or position == "tail"
                or (position == first.stopped and first.end != "release")
            )
            if excused:
                # A crash, a lost recovery point, a completion that did not apply, a call
                # left to its lease: the step may run again, once its lease has ended.
                end = _lease_end(trace, first.claim.owner)
                if end is not None and later.claim.at < end - _SLACK:
                    return [
                        f"step ran again inside the lease: call {first.call} made the effect "
                        f"of {name} and its lease ran until {end:.3f}, but call {later.call} "
                        f"claimed the key at {later.claim.at:.3f} and made that effect again "
                        "(an interrupted step may run again only once its lease has ended: "
                        "does the store grant a claim on a live lease?)"
                    ]
                continue
            what = "raised" if outcome.error is not None else "returned"
            error = outcome.error
            why = f"{what} {type(error).__name__}: {error}"[:160] if error else what
            return [
                f"step repeated: call {first.call} made the effect of {name} and {why}; "
                "nothing crashed and no recovery point was lost, so the key was released with "
                f"its progress kept and call {later.call} made that effect again at once (a "
                "step's function that raises must not have made its effect: return a result "
                "once it did, and raise only when the effect did not happen)"
            ]
    return []


_SLACK = 0.001
"""Leases end on whole milliseconds."""


def _lease_end(trace: Trace, owner: str | None) -> float | None:
    """The latest lease end the store wrote for ``owner``'s claim (renewals included)."""
    if trace.store is None or owner is None:
        return None
    end: float | None = None
    for op in trace.store.ops:
        if op.name not in ("claim", "extend") or getattr(op.arg, "owner", None) != owner:
            continue
        for application in op.applications:
            after = application.after
            if after is not None and after.owner == owner and after.lease_end is not None:
                end = after.lease_end if end is None else max(end, after.lease_end)
    return end


def _step(run: _Run, position: int | str) -> str:
    assert isinstance(position, int)
    name = run.names.get(position) or (
        run.resumed[position] if position < len(run.resumed) else None
    )
    return f"step {position + 1} ({name!r})" if name else f"step {position + 1}"
