"""Scenarios: managers (processes) sharing one store, calls over a few keys, and faults.

A scenario is a plain value generated from a seed, so a failure can be printed and rerun.
Times are whole milliseconds times ``scale`` (virtual time runs at scale 1; a real store
at a smaller scale keeps a real-time run short).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["CallPlan", "Fault", "FaultKind", "ManagerPlan", "Scenario", "generate"]

FaultKind = Literal["error", "lose", "resend", "delay", "stall", "nonsense"]
Behaviour = Literal["return", "raise", "hang", "swallow", "block", "unstorable"]
DeadlineMode = Literal["timeout", "deadline", "ambient", "none"]

OPS = ("claim", "get", "complete", "release")


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault on the ``nth`` (0-based) ``op`` that one call sends to the store.

    ``error``: raise before applying.  ``lose``: apply, then lose the answer.  ``resend``:
    apply, lose the answer, send it again (an SDK retry).  ``delay``/``stall``: wait
    ``seconds`` before applying.  ``nonsense``: apply, then answer something that is not
    a store answer.
    """

    op: str
    nth: int
    kind: FaultKind
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class ManagerPlan:
    """One process: its clock skew and the options of its manager."""

    skew: float
    wait: bool
    wait_timeout: float
    lease: float | None
    lease_margin: float
    expires_after: float
    use_local_cache: bool
    completion_reserve: float | None


@dataclass(frozen=True, slots=True)
class CallPlan:
    """One ``execute`` call: who sends it, when, for which key, and what its callback does."""

    manager: int
    key: int | None
    """Index of the key; ``None`` sends a payload without a key (run without idempotency)."""
    amount: int
    """The validated part of the payload: calls of one key with another amount are misuse."""
    at: float
    deadline: DeadlineMode
    timeout: float
    behaviour: Behaviour
    duration: float
    cancel_after: float | None
    faults: tuple[Fault, ...] = ()


@dataclass(frozen=True, slots=True)
class Scenario:
    seed: int
    validate: bool
    managers: tuple[ManagerPlan, ...]
    calls: tuple[CallPlan, ...]
    scale: float = 1.0

    def describe(self) -> str:
        """The scenario as readable text (printed with every failure)."""
        lines = [f"scenario seed={self.seed} scale={self.scale} validate={self.validate}"]
        for index, plan in enumerate(self.managers):
            lines.append(f"  manager {index}: {plan}")
        for index, call in enumerate(self.calls):
            lines.append(f"  call {index}: {call}")
        return "\n".join(lines)


def _ms(rng: random.Random, low: float, high: float, scale: float) -> float:
    """A duration in whole (scaled) milliseconds: unquantized timers can livelock a
    virtual clock on float rounding."""
    return round(rng.uniform(low, high) * scale, 3)


def generate(seed: int, *, scale: float = 1.0, live: bool = False) -> Scenario:
    """The scenario of ``seed``: 3-4 managers, 6-12 calls over at most 3 keys, >= 1 fault.

    ``live`` (real-time runs): no callback blocks the loop, and every manager has a
    ``lease`` so no call without a deadline holds a key for the whole TTL.
    """
    rng = random.Random(seed)
    managers = tuple(_manager(rng, scale, live) for _ in range(rng.randint(3, 4)))
    keys = rng.randint(1, 3)
    calls = [_call(rng, len(managers), keys, scale, live) for _ in range(rng.randint(6, 12))]
    if rng.random() < 0.5:
        # A burst of concurrent duplicates in one process.
        first = rng.randrange(len(calls))
        for index in rng.sample(range(len(calls)), k=rng.randint(1, 3)):
            original = calls[first]
            if original.key is not None:
                calls[index] = replace(
                    calls[index], manager=original.manager, key=original.key, at=original.at
                )
    if not any(call.faults for call in calls):
        index = rng.randrange(len(calls))
        calls[index] = replace(calls[index], faults=(_fault(rng, scale),))
    calls.sort(key=lambda call: call.at)
    return Scenario(seed, rng.random() < 0.7, managers, tuple(calls), scale)


def _manager(rng: random.Random, scale: float, live: bool) -> ManagerPlan:
    skewed = rng.random() < 0.3
    skew = _ms(rng, -2.0, 2.0, scale) if skewed else 0.0
    margin = 0.0
    if rng.random() < 0.4:
        margin = _ms(rng, 0.0, 2.5, scale)
    short_ttl = rng.random() < 0.15
    return ManagerPlan(
        skew=skew,
        wait=rng.random() < 0.5,
        wait_timeout=_ms(rng, 0.5, 8.0, scale),
        lease=_ms(rng, 1.0, 6.0, scale) if live or rng.random() < 0.4 else None,
        lease_margin=margin,
        expires_after=_ms(rng, 3.0, 12.0, scale) if short_ttl else 3600.0,
        use_local_cache=rng.random() < 0.3,
        completion_reserve=_ms(rng, 0.0, 0.6, scale) if rng.random() < 0.2 else None,
    )


def _call(rng: random.Random, managers: int, keys: int, scale: float, live: bool) -> CallPlan:
    behaviours: list[Behaviour] = ["return", "return", "return", "raise", "hang", "swallow"]
    behaviours += ["unstorable"]
    if not live:
        behaviours.append("block")
    deadline: DeadlineMode = rng.choice(["timeout", "timeout", "deadline", "ambient", "none"])
    faults = tuple(_fault(rng, scale) for _ in range(rng.choices([0, 1, 2], [5, 4, 1])[0]))
    key = None if rng.random() < 0.05 else rng.randrange(keys)
    if key is None and deadline == "none":
        deadline = "timeout"  # nothing else would ever stop a hanging callback
    return CallPlan(
        manager=rng.randrange(managers),
        key=key,
        amount=2 if rng.random() < 0.08 else 1,
        at=_ms(rng, 0.0, 12.0, scale),
        deadline=deadline,
        timeout=_ms(rng, 0.5, 8.0, scale),
        behaviour=rng.choice(behaviours),
        duration=_ms(rng, 0.0, 5.0, scale) if rng.random() < 0.9 else 0.0,
        cancel_after=_ms(rng, 0.0, 6.0, scale) if rng.random() < 0.15 else None,
        faults=faults,
    )


def _fault(rng: random.Random, scale: float) -> Fault:
    op = rng.choices(OPS, [5, 1, 3, 2])[0]
    kind: FaultKind = rng.choice(["error", "lose", "resend", "delay", "stall", "nonsense"])
    if kind == "nonsense":
        op = rng.choice(["claim", "complete", "release"])  # a get must answer a verdict
    seconds = 0.0
    if kind == "delay":
        seconds = _ms(rng, 0.001, 6.0, scale)
    elif kind == "stall":
        seconds = round(100.0 * scale, 3)
    return Fault(op, rng.choices([0, 1], [4, 1])[0], kind, seconds)
