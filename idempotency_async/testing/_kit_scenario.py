"""The test kit's scenarios: calls of the user's handler with one payload, as plain values.

A scenario is what the kit runs and what a failure shrinks to and prints: its ``repr`` is
valid Python (``Scenario(payload=..., calls=(Call(...), ...))``), so a reproducer can be
pasted.  The generator in :func:`scenarios_for` makes the kit's default set for one
payload: duplicates in sequence and at once (one process and two), the first call
cancelled at each await it makes until its record completes, store faults and lost
answers on its requests, a retry after the lease, and the key reused with another payload.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from idempotency_async.testing._plans import Fault

__all__ = ["Call", "Fault", "Scenario", "Start", "candidates", "scenarios_for"]

Start = Literal["with_previous", "after_previous", "after_lease"]


@dataclass(frozen=True, slots=True)
class Call:
    """One call of the handler.

    ``start``: at once with the previous call, once it ended, or once every lease the
    store holds for the key has ended.  ``process``: which copy of the handler sends it
    (each copy is built on the same store, as two processes are).  ``variant``: it sends
    the scenario's other payload (the same key, other fields).  ``cancel_at``: its task is
    cancelled at its n-th await (1-based), as a process crash or a caller giving up would.
    ``faults``: what goes wrong with the store requests it sends (``Fault("record_step",
    n, ...)``: the recovery point of its step n + 1).  For a handler that takes steps
    (recovery points): ``crash_before_step=n`` crashes the call once its step n (1-based)
    has run, before its recovery point is sent (the step's effect made, nothing recorded);
    ``crash_after_step=n`` crashes it once that recovery point is written.
    """

    start: Start = "after_previous"
    process: int = 0
    variant: bool = False
    cancel_at: int | None = None
    faults: tuple[Fault, ...] = ()
    crash_before_step: int | None = None
    crash_after_step: int | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    """Calls of the handler, in order, all with ``payload`` (or ``variant``)."""

    payload: Any
    calls: tuple[Call, ...] = (Call(),)
    variant: Any = None
    name: str = field(default="", compare=False)
    """What the scenario tries (in the report; not part of the reproducer)."""

    def __repr__(self) -> str:
        calls = ", ".join(_call_repr(call) for call in self.calls)
        if len(self.calls) == 1:
            calls += ","
        variant = f", variant={self.variant!r}" if any(c.variant for c in self.calls) else ""
        return f"Scenario(payload={self.payload!r}{variant}, calls=({calls}))"


def _call_repr(call: Call) -> str:
    parts = [
        f"{name}={getattr(call, name)!r}"
        for name in (
            "start",
            "process",
            "variant",
            "cancel_at",
            "faults",
            "crash_before_step",
            "crash_after_step",
        )
        if getattr(call, name) != getattr(_DEFAULT, name)
    ]
    return f"Call({', '.join(parts)})"


_DEFAULT = Call()

_FAULTS: tuple[Fault, ...] = (
    Fault("claim", 0, "error"),
    Fault("claim", 0, "lose"),
    Fault("claim", 0, "resend"),
    Fault("claim", 0, "nonsense"),
    Fault("claim", 0, "error", error="throttled"),
    Fault("complete", 0, "error"),
    Fault("complete", 0, "lose"),
    Fault("complete", 0, "resend"),
    Fault("complete", 0, "late", seconds=0.5),
    Fault("complete", 0, "slow_answer", seconds=0.2),
    Fault("release", 0, "error"),
    Fault("get", 0, "error"),
)
"""Each tried on the first call: failures before the write applied, lost answers (after
it applied), SDK resends, nonsense answers, late and slow answers."""


def scenarios_for(
    payload: Any, variants: list[Any], steps: int, limit: int, recovery_points: int = 0
) -> list[Scenario]:
    """The default scenarios for ``payload`` after its one-call check: ``steps`` is how many
    awaits its first call makes until its record completes (each becomes a crash point, at
    most ``limit`` of them spread evenly); ``variants`` are payloads sharing its key;
    ``recovery_points``: how many steps its first call recorded (each is crashed before and
    after its recovery point, and its write failed and its answer lost)."""
    after: Start = "after_previous"
    together: Start = "with_previous"
    lease: Start = "after_lease"
    plain = [
        Scenario(payload, (Call(), Call(after), Call(after)), name="sequential duplicates"),
        Scenario(payload, (Call(), Call(together), Call(together)), name="concurrent duplicates"),
        Scenario(
            payload,
            (Call(), Call(together, process=1), Call(after, process=1)),
            name="concurrent duplicates in two processes",
        ),
        Scenario(payload, (Call(), Call(lease)), name="a retry after the lease"),
    ]
    crashes = [
        Scenario(
            payload,
            (Call(cancel_at=at), Call(after, process=1), Call(lease, process=1), Call(after)),
            name=f"the first call cancelled at its await #{at}",
        )
        for at in _spread(steps, limit)
    ]
    faults = [
        Scenario(
            payload,
            (Call(faults=(fault,)), Call(after), Call(lease, process=1)),
            name=f"{fault.kind} ({fault.error}) on the first {fault.op}",
        )
        for fault in _FAULTS
    ]
    reuse = [
        Scenario(
            payload,
            (Call(), Call(after, variant=True), Call(after)),
            variant=variant,
            name="the key reused with another payload",
        )
        for variant in variants[:2]
    ]
    # The key check first (as the one-call check the kit runs before these): it names a
    # defect of the key expression that the scenarios after it would report less plainly.
    return reuse + plain + _at_recovery_points(payload, recovery_points) + crashes + faults


_RECOVERY_POINTS = 8
"""At most this many of a handler's steps are crashed at (the first, the last, and
between them spread evenly)."""


def _at_recovery_points(payload: Any, count: int) -> list[Scenario]:
    """For a handler that takes steps: at each step, a crash after its effect and before
    its recovery point (a duplicate at once is refused, the retry after the lease runs the
    step again, the next replays), a crash once it is recorded (the retry resumes after
    it), and its write failed before and after it applied (``StepNotRecordedError``)."""
    after: Start = "after_previous"
    lease: Start = "after_lease"
    found: list[Scenario] = []
    for number in _spread(count, _RECOVERY_POINTS) if count else ():
        found += [
            Scenario(
                payload,
                (
                    Call(crash_before_step=number),
                    Call(after, process=1),
                    Call(lease, process=1),
                    Call(after),
                ),
                name=f"a crash after step {number}'s effect, before its recovery point",
            ),
            Scenario(
                payload,
                (Call(crash_after_step=number), Call(lease, process=1), Call(after)),
                name=f"a crash after step {number}'s recovery point",
            ),
        ]
        found += [
            Scenario(
                payload,
                (Call(faults=(fault,)), Call(after), Call(lease, process=1), Call(after)),
                name=f"{fault.kind} on step {number}'s recovery point",
            )
            for fault in (
                Fault("record_step", number - 1, "error"),
                Fault("record_step", number - 1, "lose"),
            )
        ]
    return found


def _spread(steps: int, limit: int) -> list[int]:
    if steps <= limit:
        return list(range(1, steps + 1))
    return sorted({1 + round(i * (steps - 1) / (limit - 1)) for i in range(limit)})


def candidates(scenario: Scenario) -> Iterator[Scenario]:
    """Scenarios one step simpler than ``scenario`` (the shrinker keeps those still failing
    the same way)."""
    calls = scenario.calls
    for index in reversed(range(len(calls))):
        if len(calls) > 1:
            yield replace(scenario, calls=calls[:index] + calls[index + 1 :])
    for index, call in enumerate(calls):
        simpler: list[Call] = []
        for fault in range(len(call.faults)):
            simpler.append(replace(call, faults=call.faults[:fault] + call.faults[fault + 1 :]))
        for change in (
            {"cancel_at": None},
            {"crash_before_step": None},
            {"crash_after_step": None},
            {"process": 0},
            {"variant": False},
            {"start": "after_previous"},
        ):
            simpler.append(replace(call, **change))
        if call.cancel_at is not None and call.cancel_at > 1:
            simpler.append(replace(call, cancel_at=call.cancel_at - 1))
        for candidate in simpler:
            if candidate != call:
                yield replace(scenario, calls=(*calls[:index], candidate, *calls[index + 1 :]))
