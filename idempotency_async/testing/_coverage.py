"""Which pairs of axis values (and named triples) a run crossed, read from its traces.

A call's values are what it was (its door, its manager's renewal and cache, the store's
clock, its process's skew, its callback's shape and outcome, its deadline sources, its
steps — none when the store does not record steps) and,
for the faults, what happened: a fault counts where it fired, on the request it fired on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

from idempotency_async.record import Status
from idempotency_async.testing._axes import (
    AXES,
    STEP_ENDS,
    TRIPLE_FEATURES,
    TRIPLES,
    Pair,
    feasible_pairs,
    pairs_of,
    triples_of,
)
from idempotency_async.testing._plans import CallPlan, Scenario
from idempotency_async.testing._trace import Trace

__all__ = ["Coverage", "call_values", "coverage_of"]

_COMPLETE_EARLY = frozenset(
    {"complete_then_run", "complete_then_raise", "complete_odd", "complete_twice"}
)
_ATTACH = frozenset({"complete_without_response", "attach_later", "without_response_then_raise"})
_OUTCOMES = {
    "swallow": "ignore_cutoff",
    "block": "ignore_cutoff",
    "base_exception": "crash",
    "falsy": "odd_result",
    "unstorable": "odd_result",
    "wide_int": "odd_result",
    "surrogate": "odd_result",
    "nan": "odd_result",
    "complete_odd": "odd_result",
    "complete_then_run": "return",
    "complete_twice": "return",
    "complete_then_raise": "raise",
    "without_response_then_raise": "raise",
    "complete_without_response": "return",
    "attach_later": "return",
    "complete_when_cut_off": "hang",
}


def call_values(
    scenario: Scenario, index: int, refused: Collection[int] = (), records_steps: bool = True
) -> dict[str, str]:
    """The axis values of call ``index`` (faults aside: they count where they fired);
    ``records_steps`` False: the store took no steps (its callbacks took none)."""
    plan = scenario.calls[index]
    manager = scenario.managers[plan.manager]
    values = {
        "door": _door(plan),
        "renewal": "on"
        if manager.renew_lease is not None and plan.manager not in refused
        else "off",
        "cache": "on" if manager.use_local_cache else "off",
        "clock": "server" if scenario.server_clock else "client",
        "skew": "skewed" if manager.skew or manager.jump else "none",
        # The HTTP door redacts nothing of the manager's (the middleware owns redaction).
        "redaction": "off" if plan.door == "http" else manager.redaction,
    }
    if plan.door == "operator":
        return values
    values["shape"] = plan.shape if plan.door in ("execute", "execute_call") else "coroutine"
    values["outcome"] = _OUTCOMES.get(plan.behaviour, plan.behaviour)
    sources = {plan.deadline, *(mode for mode, _ in plan.also)} - {"none"}
    if plan.door in ("batch", "mcp", "route"):
        sources = {"ambient" if mode in ("timeout", "deadline") else mode for mode in sources}
    values["deadline"] = "several" if len(sources) > 1 else next(iter(sources), "none")
    values["steps"] = _steps(plan) if records_steps else "none"
    if values["steps"] in STEP_ENDS:
        # The callback ends at its step: raising (or crashing) is its outcome.
        values["outcome"] = "crash" if plan.step_fault == "crash_in" else "raise"
    return values


def _steps(plan: CallPlan) -> str:
    if not plan.steps or plan.shape == "plain":
        return "none"
    if plan.step_fault == "none" or plan.step_at >= plan.steps:
        return "run"
    return plan.step_fault


def _door(plan: CallPlan) -> str:
    if plan.door != "execute_call":
        return plan.door
    if plan.behaviour in _COMPLETE_EARLY:
        return "call_complete"
    if plan.behaviour in _ATTACH:
        return "call_attach"
    return "call_never"


@dataclass(slots=True)
class Coverage:
    """How many times each pair and named triple was crossed, over how many scenarios."""

    pairs: Counter[Pair] = field(default_factory=Counter)
    triples: Counter[str] = field(default_factory=Counter)
    scenarios: int = 0

    def add(self, other: Coverage) -> None:
        self.pairs.update(other.pairs)
        self.triples.update(other.triples)
        self.scenarios += other.scenarios

    def missing_pairs(self, excluded: Collection[str] = ()) -> list[Pair]:
        """The pairs that can meet (their features not left out) and never did."""
        return sorted(feasible_pairs(frozenset(excluded)) - set(self.pairs))

    def due_triples(self, excluded: Collection[str] = ()) -> list[str]:
        return [name for name in TRIPLES if not TRIPLE_FEATURES[name] & set(excluded)]

    def missing_triples(self, excluded: Collection[str] = ()) -> list[str]:
        return [name for name in self.due_triples(excluded) if not self.triples[name]]

    def summary(self, excluded: Collection[str] = ()) -> str:
        """The coverage as text: pairs crossed of those due, each named triple's count, and
        what is missing."""
        due = feasible_pairs(frozenset(excluded))
        crossed = len(due & set(self.pairs))
        thinnest = min((self.pairs[p] for p in due), default=0)
        lines = [
            f"pairs: {crossed} of {len(due)} crossed over {self.scenarios} scenarios "
            f"(the rarest {thinnest} times; {len(_all_pairs()) - len(due)} more cannot meet "
            "or belong to features left out)"
        ]
        for name in TRIPLES:
            if name in self.due_triples(excluded):
                lines.append(f"  triple {name}: {self.triples[name]}")
            else:
                lines.append(f"  triple {name}: not due (features left out)")
        missing = self.missing_pairs(excluded)
        if missing:
            shown = ", ".join(f"{a}={va} x {b}={vb}" for (a, va), (b, vb) in missing[:20])
            lines.append(f"  missing {len(missing)} pair(s): {shown}")
        return "\n".join(lines)


def _all_pairs() -> list[Pair]:
    axes = list(AXES)
    return [
        ((a, va), (b, vb))
        for i, a in enumerate(axes)
        for b in axes[i + 1 :]
        for va in AXES[a]
        for vb in AXES[b]
    ]


def coverage_of(trace: Trace) -> Coverage:
    """The pairs and named triples one scenario's run crossed (each counted once per
    scenario: "the rarest pair, N times" means in N scenarios)."""
    coverage = Coverage(scenarios=1)
    refused = set(trace.refused)
    fired: dict[int, set[tuple[str, str]]] = {}
    for op in trace.store.ops:
        if op.call is not None and op.fault is not None:
            fired.setdefault(op.call, set()).add((op.fault.kind, op.fault.op))
    pairs: set[Pair] = set()
    triples: set[str] = set()
    for index, outcome in enumerate(trace.outcomes):
        if outcome.skipped:
            continue
        values = call_values(trace.scenario, index, refused, trace.records_steps)
        events = set(_events(trace, index))
        for kind, place in fired.get(index) or [("none", "none")]:
            row = {**values, "fault": kind, "place": place}
            pairs.update(pairs_of(row))
            triples.update(triples_of(row, events))
    coverage.pairs.update(pairs)
    coverage.triples.update(triples)
    return coverage


def _events(trace: Trace, index: int) -> Iterator[str]:
    plan = trace.scenario.calls[index]
    for op in trace.store.ops:
        if op.call != index or op.name != "extend":
            continue
        if any(
            application.before is not None and application.before.owner != op.arg.owner
            for application in op.applications
        ):
            yield "extend_after_takeover"
            break
    if plan.latency and plan.door == "batch":
        yield "slow_store"
    if plan.middleware:
        yield "middleware"
    outcome = trace.outcomes[index]
    if outcome.error is None and outcome.returned_value and not outcome.runs:
        yield "replayed"
    key = trace.call_keys.get(index)
    manager = trace.scenario.managers[plan.manager]
    wall = trace.base + outcome.entered - trace.start + manager.skew
    if key is not None and any(
        op.key == key
        and application.after is not None
        and application.after.status is Status.COMPLETED
        and application.after.expiration < wall
        for op in trace.store.ops
        for application in op.applications
    ):
        yield "after_expiry"  # a record of its key had completed and expired by then
