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

from idempotency_async.testing._axes import AXES, SLOW, VALUE_FEATURES, conflict, covering_rows

__all__ = [
    "FEATURES",
    "can_renew",
    "renewal_reserve",
    "CallPlan",
    "Fault",
    "FaultKind",
    "ManagerPlan",
    "Scenario",
    "generate",
]

FaultKind = Literal[
    "error", "lose", "resend", "delay", "stall", "nonsense", "late", "slow_answer", "adrift"
]
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
    "complete_odd",
    "complete_twice",
    "without_response_then_raise",
    "stream",
    "server_error",
]
DeadlineMode = Literal["timeout", "deadline", "ambient", "lambda", "none"]
Door = Literal["execute", "execute_call", "decorated", "operator", "batch", "http"]
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
        # Issue "Where features meet": features crossed, not tried one at a time.
        "cross",  # each seed's focus call realizes a row of a covering array of the axes
        "http",  # the HTTP gate (an Idempotency-Key request through the ASGI adapter)
        "http_middleware",  # ... with a compressing middleware between the gate and the app
        "lambda_context",  # a batch with a Lambda context (remaining time in milliseconds)
        "slow_batch",  # ... under a slow store, its deadline close
        "deadline_sources",  # several deadline sources on one call (the earliest wins)
        "slow_answers",  # answers that come slowly after the write applied; requests adrift
        "late_extends",  # extends that land late: after a newer one, or after a takeover
        "renew_settings",  # renewal settings that can never renew (to be refused)
        "gate_late_completion",  # an HTTP stream's first completion landing late
    }
)
"""What the generator can add beyond the original scenarios; ``generate(exclude=...)``
leaves some out (a seed draws the same numbers either way, so it stays comparable)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault on the ``nth`` (0-based) ``op`` that one call sends to the store.

    ``error``: raise before applying.  ``lose``: apply, then lose the answer.  ``resend``:
    apply, lose the answer, send it again (an SDK retry).  ``delay``/``stall``: wait
    ``seconds`` before applying (a request abandoned meanwhile never lands).  ``nonsense``:
    apply, then answer something that is not a store answer.  ``slow_answer``: apply at
    once, answer ``seconds`` later.  ``adrift``: the request is on its way for ``seconds``
    and lands then even if its sender abandoned it (a request cannot be unsent).
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
    also: tuple[tuple[DeadlineMode, float], ...] = ()
    """Further deadline sources of the call, each with its seconds: the earliest of all
    wins (``lambda``: the Lambda context of a batch, its remaining time in ms)."""
    middleware: bool = False
    """``http``: a middleware compressing the app's responses sits inside the gate."""
    latency: float = 0.0
    """Every store request of the call takes this long to reach the store (a slow store)."""


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
    live: bool = False
    """Generated for a real-time run (no callback blocks the loop, every manager has a
    ``lease``); informational: the scenario runs as it is, in either time."""

    def describe(self) -> str:
        """The scenario as readable text (printed with every failure)."""
        lines = [
            f"scenario seed={self.seed} scale={self.scale} validate={self.validate} "
            f"server_clock={self.server_clock} capacity={self.capacity} live={self.live}"
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
            CallPlan(
                **{
                    **plan,
                    "faults": tuple(Fault(**fault) for fault in plan["faults"]),
                    "also": tuple((mode, seconds) for mode, seconds in plan.get("also", ())),
                }
            )
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
    clock_given = server_clock is not None or live
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
    # The features of "Where features meet", each from a stream of its own (left out, the
    # scenario is the one the seed made before they existed).
    managers = _settled_renewal(seed, managers, on, scale)
    calls = _newer_features(seed, calls, managers, on, scale, live)
    if "cross" in on:
        realized = _cross(seed, calls, managers, server_clock, clock_given, keys, on, scale, live)
        calls, managers, server_clock = realized
    if "gate_late_completion" not in on:
        calls = [_no_late_stream_head(call) for call in calls]
    calls.sort(key=lambda call: call.at)
    validate = rng.random() < 0.7
    return Scenario(
        seed, validate, managers, tuple(calls), scale, server_clock, capacity, live=live
    )


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


def _no_late_stream_head(call: CallPlan) -> CallPlan:
    """An HTTP stream's completions with no late landing (its answer is lost instead)."""
    if call.door != "http" or call.behaviour != "stream":
        return call
    faults = tuple(
        replace(fault, kind="lose", seconds=0.0)
        if fault.op == "complete" and fault.kind in ("late", "adrift")
        else fault
        for fault in call.faults
    )
    return replace(call, faults=faults)


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


# -- renewal settings -------------------------------------------------------------------


def renewal_reserve(plan: ManagerPlan) -> float:
    """The completion reserve of a short lease, from the contract: min(0.5 s, 20 % of the
    short lease), or the ``completion_reserve`` option (never more than the lease)."""
    renew = plan.renew_lease
    assert renew is not None
    if plan.completion_reserve is not None:
        return min(plan.completion_reserve, renew)
    return min(0.5, 0.2 * renew)


def can_renew(plan: ManagerPlan) -> bool:
    """Whether a manager's renewal settings can keep a lease (the contract: a renewal can
    be confirmed before the first cutoff, and one lost renewal can be survived — the one
    after it still lands before the cutoff of the lease before it).  Settings that cannot
    must be refused with ConfigError at construction."""
    renew = plan.renew_lease
    if renew is None:
        return True
    every = plan.renew_every if plan.renew_every is not None else renew / 3
    return 2 * every + renewal_reserve(plan) < renew


def _valid_renewal(plan: ManagerPlan) -> ManagerPlan:
    """``plan`` with renewal settings that can renew (the interval shortened, the reserve
    option dropped if it alone leaves no room)."""
    renew = plan.renew_lease
    if renew is None or can_renew(plan):
        return plan
    if plan.completion_reserve is not None and plan.completion_reserve >= 0.3 * renew:
        plan = replace(plan, completion_reserve=None)
    every = round((renew - renewal_reserve(plan)) / 2.5, 3)
    return replace(plan, renew_every=every)


def _settled_renewal(
    seed: int, managers: tuple[ManagerPlan, ...], on: frozenset[str], scale: float
) -> tuple[ManagerPlan, ...]:
    """Renewal settings that can renew; with ``renew_settings``, now and then some that
    cannot (the manager must refuse them)."""
    rng = random.Random(f"settings-{seed}")
    settled = []
    for plan in managers:
        roll = rng.random()
        if plan.renew_lease is not None and "renew_settings" in on and roll < 0.12:
            renew = plan.renew_lease
            if rng.random() < 0.5:
                # The first renewal comes after the cutoff of the first short lease.
                every = round(renew * rng.uniform(0.8, 0.95), 3)
                plan = replace(plan, renew_every=every, completion_reserve=None)
            else:
                # The reserve leaves no time to renew before the cutoff.
                plan = replace(plan, completion_reserve=round(renew * rng.uniform(0.6, 1.0), 3))
            settled.append(plan)
        else:
            settled.append(_valid_renewal(plan))
    return tuple(settled)


# -- doors, deadline sources and faults added by "Where features meet" ---------------------

_SOURCES: dict[str, tuple[DeadlineMode, ...]] = {
    "execute": ("timeout", "deadline", "ambient"),
    "execute_call": ("timeout", "deadline", "ambient"),
    "decorated": ("timeout", "ambient"),
    "batch": ("ambient", "lambda"),
    "http": ("ambient",),
}


def _newer_features(
    seed: int,
    calls: list[CallPlan],
    managers: tuple[ManagerPlan, ...],
    on: frozenset[str],
    scale: float,
    live: bool,
) -> list[CallPlan]:
    http = random.Random(f"http-{seed}")
    lam = random.Random(f"lambda-{seed}")
    sources = random.Random(f"deadlines-{seed}")
    slow = random.Random(f"slow-{seed}")
    late = random.Random(f"late-extends-{seed}")
    out = []
    for call in calls:
        if "http" in on and http.random() < 0.1:
            call = _as_http(http, call, "http_middleware" in on, scale)
        if "lambda_context" in on and call.door == "batch" and lam.random() < 0.5:
            call = replace(call, deadline="lambda", timeout=_finite(call.timeout, scale))
            if "slow_batch" in on and lam.random() < 0.35:
                call = _slow_batch(lam, call, scale)
        if "deadline_sources" in on and sources.random() < 0.2:
            call = _more_sources(sources, call, scale, "lambda_context" in on)
        if "slow_answers" in on:
            call = _slow_answers(slow, call, scale)
        if "late_extends" in on and managers[call.manager].renew_lease is not None:
            call = _late_extend(late, call, managers[call.manager], scale)
        out.append(call)
    return out


def _finite(timeout: float, scale: float) -> float:
    return timeout if math.isfinite(timeout) else round(4.0 * scale, 3)


_HTTP_KEPT = frozenset({"return", "raise", "hang", "swallow", "block", "base_exception"})


def _as_http(rng: random.Random, call: CallPlan, middleware: bool, scale: float) -> CallPlan:
    """The call as an HTTP request through the gate: the endpoint answers, streams, fails
    with a 5xx or raises; its deadline is the request's ``request_timeout``."""
    if call.key is None or call.door not in ("execute", "decorated") or call.shape == "plain":
        return call
    behaviour: Behaviour = call.behaviour if call.behaviour in _HTTP_KEPT else "return"
    roll = rng.random()
    if roll < 0.3:
        behaviour = "stream"
    elif roll < 0.4:
        behaviour = "server_error"
    also: tuple[tuple[DeadlineMode, float], ...] = ()
    if call.deadline == "ambient":
        also = (("ambient", _ms(rng, 0.5, 8.0, scale)),)
    return replace(
        call,
        door="http",
        behaviour=behaviour,
        deadline="timeout",
        timeout=_finite(call.timeout, scale),
        also=also,
        middleware=middleware and rng.random() < 0.3,
    )


def _slow_batch(rng: random.Random, call: CallPlan, scale: float) -> CallPlan:
    """A Lambda batch under a slow store, its remaining time close: every request of it is
    slow, and the invocation ends soon after its store work would."""
    latency = _ms(rng, 0.02, 0.3, scale)
    return replace(
        call,
        latency=latency,
        timeout=_ms(rng, 0.1, 1.2, scale),
        behaviour="return",
        duration=_ms(rng, 0.0, 0.2, scale),
    )


def _more_sources(rng: random.Random, call: CallPlan, scale: float, lambdas: bool) -> CallPlan:
    """One or two more deadline sources: the earliest of all is the call's deadline."""
    modes = [
        mode
        for mode in _SOURCES.get(call.door, ())
        if mode != call.deadline and (lambdas or mode != "lambda")
    ]
    if not modes or not math.isfinite(call.timeout):
        return call
    chosen = rng.sample(modes, k=min(len(modes), rng.randint(1, 2)))
    also = tuple((mode, _ms(rng, 0.5, 8.0, scale)) for mode in chosen)
    return replace(call, also=call.also + also)


def _slow_answers(rng: random.Random, call: CallPlan, scale: float) -> CallPlan:
    """Some faults become slow answers (the write applied, its answer late) or requests
    adrift (landing even if abandoned); now and then a slow completion is added."""
    faults = []
    for fault in call.faults:
        if fault.op != "force_release" and rng.random() < 0.15:
            kind: FaultKind = rng.choice(["slow_answer", "adrift"])
            fault = replace(fault, kind=kind, seconds=_ms(rng, 0.05, 3.0, scale))
        faults.append(fault)
    if call.door != "operator" and rng.random() < 0.06:
        kind = rng.choice(["slow_answer", "adrift", "delay"])
        faults.append(Fault("complete", 0, kind, _ms(rng, 0.05, 2.0, scale)))
    return replace(call, faults=tuple(faults))


def _late_extend(rng: random.Random, call: CallPlan, plan: ManagerPlan, scale: float) -> CallPlan:
    """An extend of a renewing call that lands late: after a newer one (it must not move
    the lease end back), or after its sender's lease lapsed and another claim took the key
    (it must be refused)."""
    if call.door == "operator" or rng.random() >= 0.25:
        return call
    renew = plan.renew_lease
    assert renew is not None
    kind: FaultKind = rng.choice(["late", "adrift"])
    seconds = round(rng.uniform(0.2, 2.0) * renew, 3)
    return replace(call, faults=(*call.faults, Fault("extend", rng.choice([0, 1]), kind, seconds)))


# -- crossing: one call per seed realizes a row of the covering array ----------------------

_ODD: tuple[Behaviour, ...] = ("falsy", "unstorable", "wide_int", "surrogate", "nan")


def _cross(
    seed: int,
    calls: list[CallPlan],
    managers: tuple[ManagerPlan, ...],
    server_clock: bool,
    clock_given: bool,
    keys: int,
    on: frozenset[str],
    scale: float,
    live: bool,
) -> tuple[list[CallPlan], tuple[ManagerPlan, ...], bool]:
    """Seed ``s`` makes one of its calls (the focus) realize row ``s mod N`` of the axes'
    covering array — door, renewal, cache, clock, skew, fault and its place, callback
    shape and outcome, deadline sources — and adds what that row needs to happen (a
    holder to wait on for a ``get``, a lost claim answer before a ``release``, a retry
    after a slow completion).  Values of features left out are replaced by their plain
    counterpart."""
    rows = covering_rows()
    row = _allowed(rows[seed % len(rows)], on)
    rng = random.Random(f"cross-{seed}")
    index = rng.randrange(len(calls))
    manager = rng.randrange(len(managers))
    plan = managers[manager]
    # The manager: renewal (valid settings), cache, skew.
    if row.get("renewal") == "on":
        renew = _ms(rng, 0.6, 2.0, scale)
        plan = _valid_renewal(
            replace(plan, renew_lease=renew, renew_every=round(renew * rng.uniform(0.2, 0.3), 3))
        )
    else:
        plan = replace(plan, renew_lease=None, renew_every=None)
    plan = replace(plan, use_local_cache=row.get("cache") == "on")
    if row.get("skew") == "skewed":
        if rng.random() < 0.7 or live:
            skew = _ms(rng, 0.1, 2.0, scale) * rng.choice([-1, 1])
            plan = replace(plan, skew=round(skew, 3))
        else:
            plan = replace(plan, jump_at=_ms(rng, 0.0, 6.0, scale), jump=_ms(rng, -2.0, 2.0, scale))
    else:
        plan = replace(plan, skew=0.0, jump_at=None, jump=0.0)
    if not clock_given:
        server_clock = row.get("clock") == "server"
    door = row.get("door", "execute")
    # A key of its own, so what the row asks for happens (the companions below share it).
    focus = _focus(rng, row, door, manager, plan, keys, calls[index].at, scale, live, on)
    extra: list[CallPlan] = []
    place, kind = row.get("place", "none"), row.get("fault", "none")
    other = (manager + 1) % len(managers)
    if place == "get" or door == "operator":
        # A holder in another process: the focus waits on it (polling with get), or the
        # operator releases its record.
        focus = replace(focus, at=round(focus.at + 0.01 * scale, 3))  # after the holder
        holder = CallPlan(
            other,
            focus.key,
            1,
            round(focus.at - 0.01 * scale, 3),
            "timeout",
            _ms(rng, 3.0, 6.0, scale),
            "return",
            _ms(rng, 1.0, 2.5, scale),
            None,
            door="http" if focus.door == "http" else "execute",
        )
        extra.append(holder)
        if place == "get":
            plan = replace(plan, wait=True, wait_timeout=_ms(rng, 3.0, 6.0, scale))
    if place == "complete" and kind in SLOW:
        # A retry after the lease (renewed or not) would have lapsed: it must replay.
        later = focus.at + focus.duration + _ms(rng, 2.0, 5.0, scale)
        extra.append(
            CallPlan(
                other,
                focus.key,
                1,
                round(later, 3),
                "timeout",
                _ms(rng, 2.0, 4.0, scale),
                "return",
                0.0,
                None,
                door="http" if focus.door == "http" else "execute",
            )
        )
    if "event" in row and "extend_after_takeover" in row["event"]:
        # Another process claims once the focus's lease lapsed; its late extend lands then.
        later = focus.at + (plan.renew_lease or 1.0) * 1.5
        extra.append(
            CallPlan(
                other,
                focus.key,
                1,
                round(later, 3),
                "timeout",
                _ms(rng, 2.0, 4.0, scale),
                "return",
                _ms(rng, 0.5, 1.5, scale),
                None,
                door="http" if focus.door == "http" else "execute",
            )
        )
    if "event" in row and "after_expiry" in row["event"]:
        # A record that lives a few seconds, and a call of the same process (its local
        # cache on) after it expired: the cache must not outlive the record.
        plan = replace(plan, expires_after=_ms(rng, 2.0, 4.0, scale))
        later = focus.at + focus.duration + plan.expires_after + _ms(rng, 1.0, 2.0, scale)
        extra.append(
            replace(focus, at=round(later, 3), faults=(), behaviour="return", cancel_after=None)
        )
    if "event" in row and "replayed" in row["event"]:
        later = focus.at + focus.duration + _ms(rng, 0.5, 1.5, scale)
        extra.append(
            replace(
                focus,
                at=round(later, 3),
                faults=(),
                manager=other,
                behaviour="return",
                cancel_after=None,
            )
        )
    if focus.deadline == "none" and not focus.also and plan.lease is None:
        plan = replace(plan, lease=_ms(rng, 2.0, 6.0, scale))  # no hour-long hang
    managers = (*managers[:manager], plan, *managers[manager + 1 :])
    calls = [*calls[:index], focus, *calls[index + 1 :], *extra]
    return calls, managers, server_clock


def _allowed(row: dict[str, str], on: frozenset[str]) -> dict[str, str]:
    """The row with the values of features left out replaced by others that fit it."""
    out = dict(row)
    for axis in AXES:
        value = out.get(axis)
        feature = VALUE_FEATURES.get((axis, value or ""))
        if value is None or feature is None or feature in on:
            continue
        for other in AXES[axis]:
            substitute = VALUE_FEATURES.get((axis, other))
            if substitute is not None and substitute not in on:
                continue
            if conflict({**out, axis: other}) is None:
                out[axis] = other
                break
        else:
            out[axis] = AXES[axis][0]
    if conflict(out) is not None:
        # Rare: no single substitution fits; the plain call, with this row's manager.
        out.update(
            door="execute",
            fault="none",
            place="none",
            shape="coroutine",
            outcome="return",
            deadline="timeout",
        )
    if out.get("door") == "operator":
        for axis in ("shape", "outcome", "deadline"):
            out.pop(axis, None)
    if "event" in row:
        events = set(row["event"].split(","))
        if "late_extends" not in on:
            events.discard("extend_after_takeover")
        if "slow_batch" not in on:
            events.discard("slow_store")
        if "http_middleware" not in on:
            events.discard("middleware")
        out["event"] = ",".join(sorted(events))
    return out


def _focus(
    rng: random.Random,
    row: dict[str, str],
    door: str,
    manager: int,
    plan: ManagerPlan,
    key: int,
    at: float,
    scale: float,
    live: bool,
    on: frozenset[str],
) -> CallPlan:
    """The focus call of a row: its door, outcome, shape, deadline and fault."""
    outcome, shape = row.get("outcome", "return"), row.get("shape", "coroutine")
    place, kind = row.get("place", "none"), row.get("fault", "none")
    events = set(row.get("event", "").split(","))
    duration = _ms(rng, 0.05, 1.5, scale)
    renew = plan.renew_lease
    if place == "extend" and renew is not None:
        duration = round(renew * rng.uniform(1.5, 3.0), 3)  # long enough to renew
    elif place == "complete" and renew is not None:
        # Completing after the first short lease, when only a renewed lease holds the key.
        duration = round(renew * rng.uniform(1.2, 2.0), 3)
    timeout = round(duration + _ms(rng, 1.5, 4.0, scale), 3)
    behaviour = _behaviour(rng, door, outcome, live)
    call_door: Door = "execute"
    if door.startswith("call_"):
        call_door = "execute_call"
    elif door in ("decorated", "batch", "http", "operator"):
        call_door = door  # type: ignore[assignment]
    deadline = row.get("deadline", "none")
    mode: DeadlineMode = "timeout"
    also: tuple[tuple[DeadlineMode, float], ...] = ()
    if deadline in ("none", "timeout", "deadline", "ambient", "lambda"):
        mode = deadline  # type: ignore[assignment]
    if deadline == "several":
        modes = [
            m
            for m in _SOURCES.get(call_door, ("timeout", "ambient"))
            if m != "lambda" or "lambda_context" in on
        ]
        mode = "timeout" if call_door == "http" else modes[0]
        others = [m for m in modes if m != mode]
        chosen = rng.sample(others, k=rng.randint(1, len(others))) if others else []
        also = tuple(
            (m, max(0.001, round(timeout + _ms(rng, -1.0, 2.0, scale), 3))) for m in chosen
        )
    if call_door == "http" and mode != "timeout":
        also, mode = ((mode, timeout),) if mode == "ambient" else (), "timeout"
    latency = 0.0
    if "slow_store" in events:
        latency = _ms(rng, 0.05, 0.3, scale)
        timeout = round(latency * rng.uniform(1.0, 4.0), 3)
        behaviour, duration = "return", 0.0
    faults: tuple[Fault, ...] = ()
    if kind != "none":
        faults = (_row_fault(rng, place, kind, plan, scale),)
        if place == "release" and behaviour not in ("raise", "cancel_self", "server_error"):
            faults = (Fault("claim", 0, "lose", error="throttled"), *faults)
    if "extend_after_takeover" in events and renew is not None:
        # Its first renewal is on its way for long; every later one fails: the callback
        # is cut off at the short lease, another claim takes the key, then the first
        # renewal lands.
        behaviour = "hang"
        timeout = round(renew * 6, 3)
        late: FaultKind = rng.choice(["late", "adrift"])
        faults = (
            Fault("extend", 0, late, round(renew * 2.5, 3)),
            *(Fault("extend", nth, "error") for nth in range(1, 8)),
        )
    return CallPlan(
        manager=manager,
        key=key,
        amount=1,
        at=at,
        deadline=mode,
        timeout=timeout,
        behaviour=behaviour,
        duration=duration,
        cancel_after=None,
        faults=faults,
        door=call_door,
        shape=shape,  # type: ignore[arg-type]
        copies=1 + (rng.random() < 0.3) if door == "batch" else 1,
        also=also,
        middleware="middleware" in events,
        latency=latency,
    )


def _behaviour(rng: random.Random, door: str, outcome: str, live: bool) -> Behaviour:
    if door == "call_complete":
        if outcome == "return":
            # Now and then completing once more: a Call completed with a response is final.
            return rng.choice(["complete_then_run", "complete_then_run", "complete_twice"])
        return {"raise": "complete_then_raise", "odd_result": "complete_odd"}.get(
            outcome, "complete_then_run"
        )  # type: ignore[return-value]
    if door == "call_attach":
        if outcome == "raise":
            return "without_response_then_raise"
        return rng.choice(["attach_later", "complete_without_response"])
    if outcome == "ignore_cutoff":
        return "swallow" if live or rng.random() < 0.6 else "block"
    if outcome == "odd_result":
        return rng.choice(_ODD)
    return {
        "crash": "base_exception",
    }.get(outcome, outcome)  # type: ignore[return-value]


def _row_fault(rng: random.Random, place: str, kind: str, plan: ManagerPlan, scale: float) -> Fault:
    seconds = 0.0
    if kind == "stall":
        seconds = round(100.0 * scale, 3)
    elif kind in ("delay", "slow_answer", "adrift", "late"):
        renew = plan.renew_lease
        if place == "complete" and renew is not None:
            # Slower than the reserve of a short lease, within the renewed lease.
            low = renewal_reserve(plan) * 1.5
            seconds = round(rng.uniform(low, max(low, 0.9 * renew)), 3)
        else:
            seconds = _ms(rng, 0.05, 2.0, scale)
    error: ErrorKind = "unavailable"
    if kind == "error":
        error = rng.choice(ERRORS)
    elif kind in ("lose", "resend", "late"):
        error = rng.choice(["unavailable", "throttled"])
    nth = 0
    if place == "extend":
        nth = rng.choice([0, 1])
    return Fault(place, nth, kind, seconds, error)  # type: ignore[arg-type]
