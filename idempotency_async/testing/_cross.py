"""Crossing features: seed ``s`` makes one of its calls realize row ``s mod N`` of the
axes' covering array (``_axes``), with what the row needs to happen.
"""

from __future__ import annotations

import random
from dataclasses import replace

from idempotency_async.testing._axes import AXES, SLOW, VALUE_FEATURES, conflict, covering_rows
from idempotency_async.testing._plans import (
    ERRORS,
    Behaviour,
    CallPlan,
    DeadlineMode,
    Door,
    ErrorKind,
    Fault,
    FaultKind,
    ManagerPlan,
    StepFault,
    renewal_reserve,
    valid_renewal,
)
from idempotency_async.testing._plans import ms as _ms

__all__ = ["SOURCES", "cross"]

SOURCES: dict[str, tuple[DeadlineMode, ...]] = {
    "execute": ("timeout", "deadline", "ambient"),
    "execute_call": ("timeout", "deadline", "ambient"),
    "decorated": ("timeout", "ambient"),
    "batch": ("ambient", "lambda"),
    "http": ("ambient",),
    "mcp": ("ambient",),
    "route": ("ambient", "lambda"),
}
"""The deadline sources each door takes besides its first."""

_ODD: tuple[Behaviour, ...] = ("falsy", "unstorable", "wide_int", "surrogate", "nan")


def cross(
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
        plan = valid_renewal(
            replace(plan, renew_lease=renew, renew_every=round(renew * rng.uniform(0.2, 0.3), 3))
        )
    else:
        plan = replace(plan, renew_lease=None, renew_every=None)
    plan = replace(plan, use_local_cache=row.get("cache") == "on")
    plan = replace(plan, redaction=row.get("redaction", "off"))
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
            door=_companion(focus.door),
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
                door=_companion(focus.door),
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
                door=_companion(focus.door),
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
    if row.get("outcome") in ("client_error", "retry_later"):
        # A retry once the endpoint answered its 4xx: a stored one must replay (status and
        # body), a released one must run the endpoint again.
        later = focus.at + focus.duration + _ms(rng, 0.5, 1.5, scale)
        extra.append(
            CallPlan(
                other,
                focus.key,
                1,
                round(later, 3),
                "ambient" if focus.door == "route" else "timeout",
                _ms(rng, 2.0, 4.0, scale),
                "return",
                0.0,
                None,
                door=_companion(focus.door),
            )
        )
    if focus.deadline == "none" and not focus.also and plan.lease is None:
        plan = replace(plan, lease=_ms(rng, 2.0, 6.0, scale))  # no hour-long hang
    if row.get("steps", "none") != "none":
        focus, extra = _stepped(seed, row, focus, extra, plan, other, scale)
    managers = (*managers[:manager], plan, *managers[manager + 1 :])
    calls = [*calls[:index], focus, *calls[index + 1 :], *extra]
    return calls, managers, server_clock


def _stepped(
    seed: int,
    row: dict[str, str],
    focus: CallPlan,
    extra: list[CallPlan],
    plan: ManagerPlan,
    other: int,
    scale: float,
) -> tuple[CallPlan, list[CallPlan]]:
    """The focus takes steps and fails at one as its row says, and what that needs to
    matter is added: a retry resuming its progress (soon after it, and once its lease
    could have ended when it left the key to its lease), or — for a mismatched step — an
    earlier call of another process that recorded the key's own steps first."""
    rng = random.Random(f"cross-steps-{seed}")  # a stream of its own: the rest as drawn
    value, place = row["steps"], row.get("place", "none")
    count = rng.randint(1, 3)
    if value in ("raise_in", "crash_in") and place == "record_step":
        count = max(count, 2)  # a recovery point is written before the failing step
        at = rng.randint(1, count - 1)
    else:
        at = rng.randrange(count)
    if place == "extend" and value != "run":
        # The callback fails at its last step: halfway through its run, past a renewal.
        count = 3
        at = count - 1
    fault: StepFault = "none" if value == "run" else value  # type: ignore[assignment]
    focus = replace(focus, steps=count, step_fault=fault, step_at=at)
    abandons = value == "crash_in" or place == "record_step"
    retries: list[float] = []
    if value != "run" or abandons:
        retries.append(focus.at + focus.duration + _ms(rng, 0.3, 1.0, scale))
    if abandons:
        bound = max(focus.timeout, plan.lease or 0.0, plan.renew_lease or 0.0)
        retries.append(focus.at + bound + _ms(rng, 0.5, 1.5, scale))
    for at_time in retries:
        extra.append(
            CallPlan(
                other,
                focus.key,
                1,
                round(at_time, 3),
                "ambient" if focus.door == "route" else "timeout",
                _ms(rng, 2.0, 4.0, scale),
                "return",
                _ms(rng, 0.0, 0.5, scale),
                None,
                door=_companion(focus.door),
                steps=count,
            )
        )
    if value == "mismatch":
        # Another process records the key's own steps (through the focus's position),
        # then fails: the focus meets its progress, and its own step there is refused.
        duration = _ms(rng, 0.05, 0.5, scale)
        first = CallPlan(
            other,
            focus.key,
            1,
            focus.at,
            "ambient" if focus.door == "route" else "timeout",
            round(duration + _ms(rng, 1.0, 2.0, scale), 3),
            "return",
            duration,
            None,
            door=_companion(focus.door),
            steps=max(count, at + 1),
            step_fault="raise_after",
            step_at=at,
        )
        shift = round(duration + _ms(rng, 0.2, 0.6, scale), 3)
        focus = replace(focus, at=round(focus.at + shift, 3))
        extra = [replace(call, at=round(call.at + shift, 3)) for call in extra]
        extra.append(first)
    return focus, extra


def _companion(door: Door) -> Door:
    """The door of a companion of the focus: one that shares its key (an HTTP request's,
    a tool call's and a route's keys are their doors' own)."""
    return door if door in ("http", "mcp", "route") else "execute"


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
            steps="none",
        )
    if out.get("door") == "operator":
        for axis in ("shape", "outcome", "deadline", "steps"):
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
    elif door in ("decorated", "batch", "http", "operator", "mcp", "route"):
        call_door = door  # type: ignore[assignment]
    deadline = row.get("deadline", "none")
    mode: DeadlineMode = "timeout"
    also: tuple[tuple[DeadlineMode, float], ...] = ()
    if deadline in ("none", "timeout", "deadline", "ambient", "lambda"):
        mode = deadline  # type: ignore[assignment]
    if deadline == "several":
        modes = [
            m
            for m in SOURCES.get(call_door, ("timeout", "ambient"))
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
        released = ("raise", "cancel_self", "server_error", "retry_later")
        if place == "release" and behaviour not in released:
            faults = (Fault("claim", 0, "lose", error="throttled"), *faults)
    if "extend_after_takeover" in events and renew is not None:
        # Its first renewal is on its way for long; every later one fails: the callback
        # is cut off at the short lease, another claim takes the key, then the first
        # renewal lands.
        behaviour = "hang"
        timeout = round(renew * 6, 3)
        late: FaultKind = rng.choice(["late", "adrift"])
        if kind in ("late", "adrift"):  # the row's own kind (the draw above kept: other
            late = "late" if kind == "late" else "adrift"  # seeds stay as they were)
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
