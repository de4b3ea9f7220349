"""Shrinking: from a failing scenario to a smallest one that still fails the same way.

Greedy and deterministic: drop calls, faults and managers, then simplify what is left
(plain behaviours, no skew, no cache...), keeping each step that still shows a violation
of the same invariant, until no step does or the budget of reruns is spent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import replace
from typing import TypeVar

from idempotency_async.testing._plans import CallPlan, ManagerPlan, Scenario

__all__ = ["shrink_live", "shrink_scenario"]

Runner = Callable[[Scenario], list[str]]
S = TypeVar("S")


def _invariant(violation: str) -> str:
    return violation.split(":", 1)[0]


def shrink_scenario(
    scenario: Scenario, run: Runner, violations: list[str], *, budget: int = 400
) -> tuple[Scenario, list[str]]:
    """The smallest scenario found that still breaks the invariant of ``violations[0]``,
    and its violations; ``run`` runs a scenario and returns its violations."""
    wanted = _invariant(violations[0]) if violations else ""
    best, found = scenario, violations
    progress = True
    while progress and budget > 0:
        progress = False
        for candidate in _candidates(best):
            budget -= 1
            if budget <= 0:
                break
            got = run(candidate)
            if any(_invariant(violation) == wanted for violation in got):
                best, found, progress = candidate, got, True
                break
    return best, found


def _candidates(scenario: Scenario) -> Iterator[Scenario]:
    calls = scenario.calls
    for index in reversed(range(len(calls))):
        if len(calls) > 1:
            yield replace(scenario, calls=calls[:index] + calls[index + 1 :])
    for index, call in enumerate(calls):
        for fault in range(len(call.faults)):
            fewer = call.faults[:fault] + call.faults[fault + 1 :]
            yield _with_call(scenario, index, replace(call, faults=fewer))
    used = {call.manager for call in calls}
    for manager in reversed(range(len(scenario.managers))):
        if manager not in used and len(scenario.managers) > 1:
            yield _without_manager(scenario, manager)
    if len(used) > 1:
        for manager in sorted(used)[1:]:
            moved = tuple(
                replace(call, manager=min(used)) if call.manager == manager else call
                for call in calls
            )
            yield replace(scenario, calls=moved)
    for simpler in (
        {"server_clock": False},
        {"capacity": None},
        {"validate": False},
    ):
        smaller = replace(scenario, **simpler)
        if smaller != scenario:
            yield smaller
    for index, call in enumerate(calls):
        for simpler_call in _simpler_call(call):
            yield _with_call(scenario, index, simpler_call)
    for index, plan in enumerate(scenario.managers):
        for simpler_plan in _simpler_manager(plan):
            managers = (*scenario.managers[:index], simpler_plan, *scenario.managers[index + 1 :])
            yield replace(scenario, managers=managers)


def _with_call(scenario: Scenario, index: int, call: CallPlan) -> Scenario:
    return replace(scenario, calls=(*scenario.calls[:index], call, *scenario.calls[index + 1 :]))


def _without_manager(scenario: Scenario, manager: int) -> Scenario:
    managers = scenario.managers[:manager] + scenario.managers[manager + 1 :]
    calls = tuple(
        replace(call, manager=call.manager - 1) if call.manager > manager else call
        for call in scenario.calls
    )
    return replace(scenario, managers=managers, calls=calls)


def _simpler_call(call: CallPlan) -> Iterator[CallPlan]:
    simpler: list[dict[str, object]] = [
        {"cancel_after": None},
        {"behaviour": "return"},
        {"door": "execute"},
        {"shape": "coroutine"},
        {"deadline": "timeout"},
        {"duration": 0.0},
        {"amount": 1},
        {"at": 0.0},
        {"also": ()},
        {"middleware": False},
        {"latency": 0.0},
        {"by_message": False},
    ]
    for change in simpler:
        candidate = replace(call, **change)  # type: ignore[arg-type]
        if candidate != call:
            yield candidate


def _simpler_manager(plan: ManagerPlan) -> Iterator[ManagerPlan]:
    simpler: list[dict[str, object]] = [
        {"skew": 0.0},
        {"jump_at": None, "jump": 0.0},
        {"lease_margin": 0.0},
        {"use_local_cache": False},
        {"wait": False},
        {"completion_reserve": None},
        {"lease": None},
        {"expires_after": 3600.0},
        {"renew_lease": None, "renew_every": None},
        {"renew_every": None},
    ]
    for change in simpler:
        candidate = replace(plan, **change)  # type: ignore[arg-type]
        if candidate != plan:
            yield candidate


async def shrink_live(
    scenario: S,
    run: Callable[[S], Awaitable[list[str]]],
    violations: list[str],
    candidates: Callable[[S], Iterable[S]],
    *,
    budget: int = 60,
) -> tuple[S, list[str]]:
    """:func:`shrink_scenario` for scenarios that run in real time on a live server: ``run``
    is awaited, and ``candidates`` gives the scenarios one step simpler than its argument."""
    wanted = _invariant(violations[0]) if violations else ""
    best, found = scenario, violations
    progress = True
    while progress and budget > 0:
        progress = False
        for candidate in candidates(best):
            budget -= 1
            if budget <= 0:
                break
            got = await run(candidate)
            if any(_invariant(violation) == wanted for violation in got):
                best, found, progress = candidate, got, True
                break
    return best, found
