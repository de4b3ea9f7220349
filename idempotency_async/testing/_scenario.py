"""Scenarios: managers (processes) sharing one store, calls over a few keys, and faults,
generated from a seed — so a failure can be printed and rerun.

The plan types are in ``_plans``; the crossing of features (one call per seed realizing a
row of the axes' covering array) in ``_cross``.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import random
from collections.abc import Collection
from dataclasses import replace

from idempotency_async.testing._cross import SOURCES, cross
from idempotency_async.testing._plans import (
    CALL_BEHAVIOURS,
    ERRORS,
    OPS,
    STEP_FAULTS,
    Behaviour,
    CallPlan,
    DeadlineMode,
    Door,
    ErrorKind,
    Fault,
    FaultKind,
    ManagerPlan,
    Scenario,
    Shape,
    StepFault,
    can_renew,
    renewal_reserve,
    valid_renewal,
)
from idempotency_async.testing._plans import ms as _ms

__all__ = [
    "FEATURES",
    "CallPlan",
    "Fault",
    "FaultKind",
    "ManagerPlan",
    "Scenario",
    "can_renew",
    "generate",
    "renewal_reserve",
]

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
        "redaction",  # managers declaring Options(redaction=...): a field kept out, or all
        "http",  # the HTTP gate (an Idempotency-Key request through the ASGI adapter)
        "http_middleware",  # ... with a compressing middleware between the gate and the app
        "lambda_context",  # a batch with a Lambda context (remaining time in milliseconds)
        "slow_batch",  # ... under a slow store, its deadline close
        "deadline_sources",  # several deadline sources on one call (the earliest wins)
        "slow_answers",  # answers that come slowly after the write applied; requests adrift
        "late_extends",  # extends that land late: after a newer one, or after a takeover
        "renew_settings",  # renewal settings that can never renew (to be refused)
        "gate_late_completion",  # an HTTP stream's first completion landing late
        "redelivery",  # SQS batches keyed by message id, messages redelivered
        "declared_errors",  # a callback raising an error declared a result (replay_errors)
        # Measured against a second blind set of mutants (tests/mutants/blind2).
        "cancel_at_cutoff",  # a caller cancelled the moment its cutoff or deadline fires
        "cleanup_completion",  # an execute_call callback completing in its cleanup
        "http_limits",  # streams declaring their Content-Length; small response limits
        "fifo_batches",  # batches from an SQS FIFO queue: records in order
        "release_races",  # a force_release racing a slow replay of the releasing process
        # The peer doors: agent tool calls and Powertools routes.
        "mcp",  # a tool call of an idempotent_tool on the MCP SDK's server
        "routes",  # an API Gateway event through a Powertools route with idempotent_route
        "statuses",  # endpoints and routes answering a 4xx: stored (402, 410) or released
        # Recovery points: stores that record steps (RecordsSteps) only.
        "steps",  # callbacks taking steps, failing at one; faults on their recovery points
    }
)
"""What the generator can add beyond the original scenarios; ``generate(exclude=...)``
leaves some out (a seed draws the same numbers either way, so it stays comparable)."""


def generate(
    seed: int,
    *,
    scale: float = 1.0,
    live: bool = False,
    exclude: Collection[str] = (),
    server_clock: bool | None = None,
    records_steps: bool = True,
) -> Scenario:
    """The scenario of ``seed``: 3-4 managers, 6-12 calls over at most 3 keys, >= 1 fault.

    ``live`` (real-time runs): no callback blocks the loop, and every manager has a
    ``lease`` so no call without a deadline holds a key for the whole TTL.  ``exclude``
    names :data:`FEATURES` to leave out.  ``server_clock`` forces the store's clock
    (``True``: the store judges by its own clock) instead of drawing it.
    ``records_steps`` False: the store does not record steps (``RecordsSteps``), so the
    scenario takes none (as if ``steps`` were left out).
    """
    unknown = set(exclude) - FEATURES
    if unknown:
        raise ValueError(f"unknown simulator features {sorted(unknown)}: use {sorted(FEATURES)}")
    on = FEATURES - set(exclude) - _unavailable(records_steps)
    if live:
        # A release race is timed to the millisecond: real time cannot keep its order.
        on -= {"server_clock", "full_store", "clock_jumps", "release_races"}
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
    if "steps" in on:
        calls = _with_steps(seed, calls, scale)
    # Before the crossing: the focus call it makes is its row's alone.
    calls, managers = _races(seed, calls, managers, on, scale)
    if "cross" in on:
        realized = cross(seed, calls, managers, server_clock, clock_given, keys, on, scale, live)
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
    if not any(f.op == "complete" and f.kind in ("late", "adrift") for f in call.faults):
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


# -- renewal settings ----------------------------------------------------------------


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
            settled.append(valid_renewal(plan))
    return tuple(settled)


# -- doors, deadline sources and faults added by "Where features meet" ---------------------


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
    redelivered = random.Random(f"redelivery-{seed}")
    peers = random.Random(f"peers-{seed}")
    statuses = random.Random(f"statuses-{seed}")
    peer_keys: dict[int, Door | None] = {}
    out = []
    for call in calls:
        if "redelivery" in on and call.door == "batch" and redelivered.random() < 0.5:
            call = replace(call, by_message=True)
        if "http" in on and http.random() < 0.1:
            call = _as_http(http, call, "http_middleware" in on, scale)
        if call.key is not None and call.key not in peer_keys:
            # A key's calls go through one peer door (its duplicates meet there).
            roll = peers.random()
            door: Door | None = None
            if "mcp" in on and roll < 0.07:
                door = "mcp"
            elif "routes" in on and roll > 0.93:
                door = "route"
            peer_keys[call.key] = door
        peer = None if call.key is None else peer_keys[call.key]
        if peer is not None:
            call = _as_peer(peers, call, peer, scale, "lambda_context" in on)
        if "statuses" in on:
            call = _with_status(statuses, call)
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


_PEER_KEPT = frozenset(
    {"return", "raise", "hang", "swallow", "block", "base_exception", "cancel_self"}
)


def _as_peer(
    rng: random.Random, call: CallPlan, door: Door, scale: float, lambdas: bool
) -> CallPlan:
    """The call as an MCP tool call or a Powertools route: its deadline is its caller's
    (ambient) or, for a route, its Lambda context's; a route answers 500 now and then."""
    if call.key is None or call.door not in ("execute", "decorated") or call.shape != "coroutine":
        return call
    behaviour: Behaviour = call.behaviour if call.behaviour in _PEER_KEPT else "return"
    if door == "route" and rng.random() < 0.15:
        behaviour = "server_error"
    deadline: DeadlineMode = "none" if call.deadline == "none" else "ambient"
    if door == "route" and lambdas and deadline == "ambient" and rng.random() < 0.5:
        deadline = "lambda"
    return replace(
        call,
        door=door,
        behaviour=behaviour,
        deadline=deadline,
        timeout=_finite(call.timeout, scale),
        also=(),
    )


def _with_status(rng: random.Random, call: CallPlan) -> CallPlan:
    """Now and then an endpoint or a route that answers a 4xx instead of 200: one the
    status policy stores (replayed to every retry), or one it releases like a 5xx."""
    roll = rng.random()
    if call.door not in ("http", "route") or call.behaviour != "return" or roll >= 0.3:
        return call
    behaviour: Behaviour = "client_error" if roll < 0.2 else "retry_later"
    return replace(call, behaviour=behaviour)


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
        for mode in SOURCES.get(call.door, ())
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
    changed = False
    for fault in call.faults:
        if fault.op != "force_release" and rng.random() < 0.15:
            kind: FaultKind = rng.choice(["slow_answer", "adrift"])
            fault = replace(fault, kind=kind, seconds=_ms(rng, 0.05, 3.0, scale))
            changed = True
        faults.append(fault)
    if call.door != "operator" and rng.random() < 0.06:
        kind = rng.choice(["slow_answer", "adrift", "delay"])
        faults.append(Fault("complete", 0, kind, _ms(rng, 0.05, 2.0, scale)))
        changed = True
    return replace(call, faults=tuple(faults)) if changed else call


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


# -- recovery points (steps) ---------------------------------------------------------------


def _with_steps(seed: int, calls: list[CallPlan], scale: float) -> list[CallPlan]:
    """Now and then a callback that takes steps before it behaves as planned (each call of
    a key takes the key's own, ``s0``, ``s1``...), failing at one now and then: its
    function raising or crashing, the callback raising after it, a step of its own name
    (a mismatch), a result that is not JSON.  From a stream of its own: left out, the
    scenario is the one the seed made before steps existed."""
    rng = random.Random(f"steps-{seed}")
    out = []
    for call in calls:
        roll = rng.random()
        if roll >= 0.2 or call.door == "operator" or call.shape == "plain":
            out.append(call)
            continue
        count = rng.randint(1, 3)
        fault: StepFault = rng.choices(STEP_FAULTS, [6, 1, 1, 1, 1, 1])[0]
        if call.door == "execute_call" or call.behaviour in ("server_error", "retry_later"):
            fault = "none"  # it completes through its Call / answers its status after them
        out.append(replace(call, steps=count, step_fault=fault, step_at=rng.randrange(count)))
    return out


# -- races and limits added after the second blind mutation set -----------------------------


def _races(
    seed: int,
    calls: list[CallPlan],
    managers: tuple[ManagerPlan, ...],
    on: frozenset[str],
    scale: float,
) -> tuple[list[CallPlan], tuple[ManagerPlan, ...]]:
    cancels = random.Random(f"cancel-at-cutoff-{seed}")
    cleanups = random.Random(f"cleanup-completion-{seed}")
    limits = random.Random(f"http-limits-{seed}")
    ordered = random.Random(f"fifo-batches-{seed}")
    releases = random.Random(f"release-races-{seed}")
    out: list[CallPlan] = []
    raced: list[CallPlan] = []
    for call in calls:
        race = "release_races" in on and call.door == "operator" and releases.random() < 0.35
        if race and not raced:
            # One per scenario: a second would start its replay while the first's is in
            # flight, joining it (see _release_race).
            raced, managers = _release_race(call, managers, scale)
            continue
        if "fifo_batches" in on and call.door == "batch" and ordered.random() < 0.4:
            call = replace(call, fifo=True)
        if "cancel_at_cutoff" in on and cancels.random() < 0.08:
            call = _cancel_at_cutoff(cancels, call, managers[call.manager])
        if "cleanup_completion" in on and call.door == "execute_call" and cleanups.random() < 0.3:
            call = replace(call, behaviour="complete_when_cut_off", shape="coroutine")
            call = replace(call, cancel_after=None)  # cleanup after its caller's cancel: (a)
        if "http_limits" in on and call.door == "http":
            if call.behaviour == "stream" and limits.random() < 0.5:
                call = replace(call, content_length=True)
            if limits.random() < 0.3:
                call = replace(call, http_limit=limits.choice([0, 8]))
        out.append(call)
    if raced:
        # The race is timed: a callback blocking the loop would pause every process and
        # bunch its steps up (the later call then joins the replay in flight).
        out = [replace(c, behaviour="swallow") if c.behaviour == "block" else c for c in out]
    return out + raced, managers


def _release_race(
    operator: CallPlan, managers: tuple[ManagerPlan, ...], scale: float
) -> tuple[list[CallPlan], tuple[ManagerPlan, ...]]:
    """An operator's force_release racing a replay of the same process, its local cache
    on: the replay's request reaches the completed record before the release and its
    answer comes after the release ended; a later call of that process must not replay
    the released record from its cache (G6).  The operator's process completes the key
    first.

    The racing process is one of its own, with no other call (as recorded seeds have
    it): a call of it starting while the replay's answer is on its way would join it
    (in-process single flight) — the defect of
    ``tests/test_simulator_regressions.py``'s
    ``test_a_call_after_its_own_force_release_joins_a_replay_sent_before_it``, fixed."""
    t0, racing = operator.at, len(managers)
    plan = replace(
        managers[operator.manager],
        use_local_cache=True,
        renew_lease=None,
        renew_every=None,
        jump_at=None,
        jump=0.0,
    )

    def call(manager: int, at: float, faults: tuple[Fault, ...] = ()) -> CallPlan:
        at = round(t0 + at * scale, 3)
        timeout = round(3.0 * scale, 3)
        return CallPlan(
            manager, operator.key, 1, at, "timeout", timeout, "return", 0.0, None, faults
        )

    slow = (Fault("claim", 0, "slow_answer", round(0.3 * scale, 3)),)
    race = [
        call(operator.manager, 0.0),  # completes the key
        call(racing, 0.5, slow),  # replays it; its answer comes after the release
        replace(operator, manager=racing, at=round(t0 + 0.55 * scale, 3), faults=()),
        call(racing, 1.0),  # must not replay the released record from the cache
    ]
    return race, (*managers, plan)


def _cancel_at_cutoff(rng: random.Random, call: CallPlan, plan: ManagerPlan) -> CallPlan:
    """The caller cancelled at the very moment its own cutoff (its lease end less the
    completion reserve) or its deadline fires — as an outer timeout of the same length
    would: the cancellation from outside must win (it is the caller's, not the call's)."""
    if call.door not in ("execute", "execute_call", "decorated") or call.also:
        return call
    if call.deadline not in ("timeout", "deadline") or not math.isfinite(call.timeout):
        return call
    if plan.renew_lease is not None or call.latency or call.shape == "plain":
        return call  # the cutoff moves with renewals; a slow claim sends it later
    left = call.timeout
    if plan.completion_reserve is not None:
        kept = min(plan.completion_reserve, left)
    else:
        kept = min(0.5, 0.2 * left)
    return replace(call, cancel_after=rng.choice([left - kept, left]))


@functools.cache
def _unavailable(records_steps: bool = True) -> frozenset[str]:
    """The peer doors whose optional dependency is not installed: the simulator runs
    without them (a user's conformance run needs neither the MCP SDK nor Powertools); and
    steps, for a store that does not record them."""
    missing = set() if records_steps else {"steps"}
    if importlib.util.find_spec("mcp") is None:
        missing.add("mcp")
    if importlib.util.find_spec("aws_lambda_powertools") is None:
        missing.add("routes")
    return frozenset(missing)
