"""Scenarios: managers (processes) sharing one store, calls over a few keys, and faults.

A scenario is a plain value generated from a seed, so a failure can be printed and rerun.
Times are whole milliseconds times ``scale`` (virtual time runs at scale 1; a real store
at a smaller scale keeps a real-time run short).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any, Literal

__all__ = [
    "FEATURES",
    "CallPlan",
    "Fault",
    "FaultKind",
    "ManagerPlan",
    "Scenario",
    "generate",
]

FaultKind = Literal["error", "lose", "resend", "delay", "stall", "nonsense", "late"]
ErrorKind = Literal["unavailable", "throttled", "denied", "validation", "inconsistent"]
Behaviour = Literal[
    "return",
    "raise",
    "hang",
    "swallow",
    "block",
    "unstorable",
    "falsy",
    "wide_int",
    "surrogate",
    "nan",
    "base_exception",
    "cancel_self",
    "complete_then_run",
    "complete_then_raise",
    "complete_without_response",
    "attach_later",
]
DeadlineMode = Literal["timeout", "deadline", "ambient", "none"]
Door = Literal["execute", "execute_call", "decorated", "operator", "batch"]
Shape = Literal["coroutine", "lambda", "plain"]

OPS = ("claim", "get", "complete", "release")
ERRORS: tuple[ErrorKind, ...] = ("unavailable", "throttled", "denied", "validation", "inconsistent")
CALL_BEHAVIOURS: tuple[Behaviour, ...] = (
    "attach_later",
    "complete_then_raise",
    "complete_then_run",
    "complete_without_response",
)

FEATURES = frozenset(
    {
        "plain_callbacks",  # a plain function passed as the callback
        "base_exceptions",  # a callback raising a BaseException that is no Exception
        "error_types",  # every store error type, not only StoreUnavailableError
        "server_clock",  # a store judging by its own clock, skewed workers, the cache on
        "force_release",  # an operator's force_release
        "bad_timeouts",  # timeout=inf / nan (must be refused with ConfigError)
        "unrepresentable",  # results a store may not represent (wide ints, surrogates, NaN)
        "get_nonsense",  # nonsense answers to get
        "nonsense_claims",  # nonsense answers to claims (an unknown outcome: to be released)
        "late_resends",  # a resend that lands after other operations
        "full_store",  # a MemoryStore that fills up
        "clock_jumps",  # a manager's wall clock jumps
        "call_handle",  # execute_call and its Call handle
        "batches",  # an SQS batch through process_batch
        "batch_duplicates",  # ... holding an in-batch duplicate
        "call_handle_cutoff",  # ... with a callback that ignores its cutoff
        "own_cancel",  # a callback raising CancelledError on its own
        "renewal",  # managers renewing a short lease, with faults on extend
    }
)
"""What the generator can add beyond the original scenarios; ``generate(exclude=...)``
leaves some out (a seed draws the same numbers either way, so it stays comparable)."""


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
    error: ErrorKind = "unavailable"
    """The error ``error``/``lose`` raise (``late``: the answer lost, the write applied
    ``seconds`` later, after other operations)."""


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
    jump_at: float | None = None
    """Loop time at which this process's wall clock jumps by ``jump`` seconds."""
    jump: float = 0.0
    renew_lease: float | None = None
    """``Options(renew_lease=...)``: a short lease renewed while the callback runs."""
    renew_every: float | None = None


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
    door: Door = "execute"
    """``operator``: a ``force_release`` of the key instead of a call; ``batch``: an SQS
    event through ``process_batch`` holding the payload ``copies`` times."""
    shape: Shape = "coroutine"
    copies: int = 1


@dataclass(frozen=True, slots=True)
class Scenario:
    seed: int
    validate: bool
    managers: tuple[ManagerPlan, ...]
    calls: tuple[CallPlan, ...]
    scale: float = 1.0
    server_clock: bool = False
    """The store judges by its own clock (the loop's, unskewed), not the managers'."""
    capacity: int | None = None
    """``max_records`` of a MemoryStore (the simulator's own store only)."""

    def describe(self) -> str:
        """The scenario as readable text (printed with every failure)."""
        lines = [
            f"scenario seed={self.seed} scale={self.scale} validate={self.validate} "
            f"server_clock={self.server_clock} capacity={self.capacity}"
        ]
        for index, plan in enumerate(self.managers):
            lines.append(f"  manager {index}: {plan}")
        for index, call in enumerate(self.calls):
            lines.append(f"  call {index}: {call}")
        return "\n".join(lines)

    def to_json(self) -> str:
        """The scenario as JSON text: ``python -m idempotency_async.testing --scenario``
        runs it again."""
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        data: dict[str, Any] = json.loads(text)
        managers = tuple(ManagerPlan(**plan) for plan in data.pop("managers"))
        calls = tuple(
            CallPlan(**{**plan, "faults": tuple(Fault(**fault) for fault in plan["faults"])})
            for plan in data.pop("calls")
        )
        return cls(managers=managers, calls=calls, **data)


def _ms(rng: random.Random, low: float, high: float, scale: float) -> float:
    """A duration in whole (scaled) milliseconds: unquantized timers can livelock a
    virtual clock on float rounding."""
    return round(rng.uniform(low, high) * scale, 3)


def generate(
    seed: int,
    *,
    scale: float = 1.0,
    live: bool = False,
    exclude: Collection[str] = (),
    server_clock: bool | None = None,
) -> Scenario:
    """The scenario of ``seed``: 3-4 managers, 6-12 calls over at most 3 keys, >= 1 fault.

    ``live`` (real-time runs): no callback blocks the loop, and every manager has a
    ``lease`` so no call without a deadline holds a key for the whole TTL.  ``exclude``
    names :data:`FEATURES` to leave out.  ``server_clock`` forces the store's clock
    (``True``: the store judges by its own clock) instead of drawing it.
    """
    unknown = set(exclude) - FEATURES
    if unknown:
        raise ValueError(f"unknown simulator features {sorted(unknown)}: use {sorted(FEATURES)}")
    on = FEATURES - set(exclude)
    if live:
        on -= {"server_clock", "full_store", "clock_jumps"}
    rng = random.Random(seed)
    managers = tuple(_manager(rng, scale, live) for _ in range(rng.randint(3, 4)))
    keys = rng.randint(1, 3)
    calls = [_call(rng, len(managers), keys, scale, live) for _ in range(rng.randint(6, 12))]
    # The wider generator draws from a second stream, so the original draws (and the
    # scenarios of seeds recorded before it existed) stay as they were.
    extra = random.Random(f"wide-{seed}")
    calls = [_widen(extra, call, on, scale) for call in calls]
    managers = tuple(_widen_manager(extra, plan, on, scale) for plan in managers)
    drawn = extra.random() < 0.15 and "server_clock" in on
    if server_clock is None:
        server_clock = drawn
    if server_clock and "server_clock" in on:
        # The case that matters: workers whose clocks are far off (the store does not
        # care) answering from their local caches records that live a few seconds.
        managers = tuple(
            replace(
                plan,
                use_local_cache=extra.random() < 0.7,
                skew=_ms(extra, -8.0, 8.0, scale) if extra.random() < 0.6 else plan.skew,
                expires_after=_ms(extra, 2.0, 8.0, scale)
                if extra.random() < 0.6
                else plan.expires_after,
            )
            for plan in managers
        )
    capacity = extra.randint(1, 2) if extra.random() < 0.1 and "full_store" in on else None
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
    if "nonsense_claims" not in on:
        calls = [
            replace(call, faults=tuple(_no_nonsense_claim(fault) for fault in call.faults))
            for call in calls
        ]
    if "renewal" in on:
        # Drawn from a stream of its own: the scenarios of seeds recorded before renewal
        # existed keep every other draw.
        renewing = random.Random(f"renew-{seed}")
        managers = tuple(_renewing(renewing, plan, scale) for plan in managers)
        calls = [_extend_faults(renewing, call, managers, scale) for call in calls]
    calls.sort(key=lambda call: call.at)
    validate = rng.random() < 0.7
    return Scenario(seed, validate, managers, tuple(calls), scale, server_clock, capacity)


def _widen(rng: random.Random, call: CallPlan, on: frozenset[str], scale: float) -> CallPlan:
    """Doors, callback shapes and outcomes, and faults the original generator never made."""
    roll = rng.random()
    door: Door = "execute"
    if roll < 0.1 and "call_handle" in on:
        door = "execute_call"
    elif roll < 0.18:
        door = "decorated"
    elif roll < 0.24 and "force_release" in on and call.key is not None:
        door = "operator"
    elif roll < 0.32 and "batches" in on and call.key is not None:
        door = "batch"
    copies = 1 + round(call.at * 1000) % 2  # an in-batch duplicate half the time
    shape: Shape = rng.choice(["coroutine", "coroutine", "lambda"])
    if rng.random() < 0.04 and "plain_callbacks" in on and door in ("execute", "decorated"):
        shape = "plain"
        door = "execute"  # the decorator refuses a plain function at decoration
    behaviour: Behaviour = call.behaviour
    pick = rng.random()
    wider: list[tuple[str, Behaviour]] = [
        ("", "falsy"),
        ("unrepresentable", "wide_int"),
        ("unrepresentable", "surrogate"),
        ("unrepresentable", "nan"),
        ("base_exceptions", "base_exception"),
        ("own_cancel", "cancel_self"),
    ]
    if pick < 0.25:
        feature, chosen = wider[rng.randrange(len(wider))]
        if not feature or feature in on:
            behaviour = chosen
    if door == "execute_call" and rng.random() < 0.6:
        behaviour = rng.choice(CALL_BEHAVIOURS)
    ignores_cutoff = behaviour in ("swallow", "block")
    if door == "execute_call" and ignores_cutoff and "call_handle_cutoff" not in on:
        behaviour = "return"
    if shape == "plain" and behaviour not in ("return", "falsy", "raise"):
        behaviour = "return"
    timeout = call.timeout
    bad = rng.random() < 0.03 and "bad_timeouts" in on
    if bad and call.deadline in ("timeout", "ambient") and door != "batch":
        timeout = rng.choice([math.inf, math.nan])
    deadline = call.deadline
    if door == "batch":
        # A batch has its Lambda context's deadline, or an ambient one, or none.
        shape = "coroutine"
        if behaviour in CALL_BEHAVIOURS:
            behaviour = "return"
        if deadline in ("timeout", "deadline"):
            deadline = "ambient"
    faults = tuple(_widen_fault(rng, fault, on, scale) for fault in call.faults)
    if door == "operator":
        # An operator's release, often slow enough for calls to answer meanwhile.
        seconds = round(rng.uniform(0.001, 3.0) * scale, 3)
        faults = (Fault("force_release", 0, "delay", seconds),) if rng.random() < 0.7 else ()
    return replace(
        call,
        door=door,
        shape=shape,
        behaviour=behaviour,
        timeout=timeout,
        faults=faults,
        deadline=deadline,
        copies=copies if door == "batch" and "batch_duplicates" in on else 1,
    )


def _no_nonsense_claim(fault: Fault) -> Fault:
    if fault.kind == "nonsense" and fault.op == "claim":
        return replace(fault, op="complete")
    return fault


def _widen_fault(rng: random.Random, fault: Fault, on: frozenset[str], scale: float) -> Fault:
    error: ErrorKind = "unavailable"
    if "error_types" in on and rng.random() < 0.5:
        error = rng.choice(ERRORS)
    kind = fault.kind
    seconds = fault.seconds
    op = fault.op
    roll = rng.random()
    if roll < 0.15 and "late_resends" in on:
        kind, seconds = "late", round(rng.uniform(0.001, 4.0) * scale, 3)
    elif roll < 0.25 and "get_nonsense" in on:
        op, kind = "get", "nonsense"
    if kind in ("lose", "resend", "late") and error not in ("unavailable", "throttled"):
        # After the write applied, only a lost answer or an SDK retry's throttling can
        # follow: a definite refusal means the write did not apply.
        error = "throttled"
    return replace(fault, op=op, kind=kind, seconds=seconds, error=error)


def _widen_manager(
    rng: random.Random, plan: ManagerPlan, on: frozenset[str], scale: float
) -> ManagerPlan:
    if rng.random() < 0.1 and "clock_jumps" in on:
        return replace(plan, jump_at=_ms(rng, 0.0, 12.0, scale), jump=_ms(rng, -3.0, 3.0, scale))
    return plan


def _renewing(rng: random.Random, plan: ManagerPlan, scale: float) -> ManagerPlan:
    if rng.random() >= 0.35:
        return plan
    lease = _ms(rng, 0.6, 3.0, scale)
    every = round(lease * rng.uniform(0.2, 0.6), 3) if rng.random() < 0.7 else None
    return replace(plan, renew_lease=lease, renew_every=every or None)


def _extend_faults(
    rng: random.Random, call: CallPlan, managers: tuple[ManagerPlan, ...], scale: float
) -> CallPlan:
    """Faults on a renewing call's extends: failed, applied with the answer lost, slow."""
    if managers[call.manager].renew_lease is None or rng.random() >= 0.4:
        return call
    kind: FaultKind = rng.choice(["error", "lose", "delay", "stall", "resend"])
    seconds = 0.0
    if kind == "delay":
        seconds = _ms(rng, 0.001, 3.0, scale)
    elif kind == "stall":
        seconds = round(100.0 * scale, 3)
    fault = Fault("extend", rng.choices([0, 1, 2], [3, 2, 1])[0], kind, seconds)
    return replace(call, faults=(*call.faults, fault))


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
