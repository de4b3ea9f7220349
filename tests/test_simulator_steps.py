"""Steps (recovery points) as an axis of the fault simulator: generated per call and
crossed with every other axis, judged by the oracle from the ledger of step effects and
the store's history — and left out for a store that does not record steps."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

import pytest
from support import MemoryWrapper

from idempotency_async import MemoryStore
from idempotency_async.errors import StepMismatchError, StepNotRecordedError
from idempotency_async.record import Claim
from idempotency_async.stores.base import Extended
from idempotency_async.testing import (
    CallPlan,
    Fault,
    ManagerPlan,
    Scenario,
    SimulationFailure,
    generate,
    run_one,
    simulate,
)
from idempotency_async.testing._oracle import check
from idempotency_async.testing._run import run_scenario
from idempotency_async.testing._vloop import VirtualClockLoop

# -- generated, and left out -------------------------------------------------------------


def test_steps_are_generated_with_every_failure_and_left_out_as_a_feature() -> None:
    faults: Counter[str] = Counter()
    writes: Counter[str] = Counter()
    for seed in range(300):
        scenario = generate(seed)
        for call in scenario.calls:
            if call.steps:
                faults[call.step_fault] += 1
            writes.update(f.kind for f in call.faults if f.op == "record_step")
        # Left out (or a store without the capability): no call takes a step.
        without = generate(seed, exclude=("steps",))
        assert all(c.steps == 0 for c in without.calls)
        assert not any(f.op == "record_step" for c in without.calls for f in c.faults)
        assert generate(seed, records_steps=False) == without
    assert set(faults) == {"none", "raise_in", "raise_after", "crash_in", "mismatch", "not_stored"}
    assert {"error", "lose", "stall", "slow_answer"} <= set(writes)


def test_a_reproduction_recorded_before_steps_loads_without_them() -> None:
    plan = {
        "manager": 0,
        "key": 0,
        "amount": 1,
        "at": 0.0,
        "deadline": "timeout",
        "timeout": 2.0,
        "behaviour": "return",
        "duration": 0.1,
        "cancel_after": None,
        "faults": [],
    }
    manager = dataclasses.asdict(_manager())
    scenario = Scenario.from_json(
        json.dumps({"seed": 1, "validate": False, "managers": [manager], "calls": [plan]})
    )
    assert scenario.calls[0].steps == 0 and scenario.calls[0].step_fault == "none"
    assert run_one(scenario) == []


def test_a_store_without_the_capability_runs_its_scenarios_without_steps() -> None:
    report = simulate(MemoryWrapper, range(60))  # no record_step: not capable
    assert "steps" in report.excluded
    assert not {name for name in report.outcomes if name.startswith("Step")}
    # Its coverage does not ask for the steps axis.
    assert not any(
        axis == "steps" or value == "record_step"
        for pair in report.coverage.missing_pairs(report.excluded)
        for axis, value in pair
    )


# -- the oracle catches a store that loses steps ------------------------------------------


class _DropsStepsOnExtend(MemoryStore):
    """Fault injection: a renewal that rewrites the record without its steps."""

    async def extend(self, claim: Claim) -> Extended:
        answer = await super().extend(claim)
        if answer is Extended.RENEWED:
            held = await super().get(claim.key, now=claim.now)
            if held.record is not None and held.record.steps is not None:
                await super().force_release(claim.key)
                await super().claim(claim)  # the same lease, no steps
        return answer


class _DropsStepsOnRelease(MemoryStore):
    """Fault injection: a release that deletes the record, steps and all."""

    async def release(self, key: str, owner: str) -> bool:
        held = await super().get(key, now=0.0)
        if held.record is not None and held.record.owner == owner:
            await super().force_release(key)
            return True
        return await super().release(key, owner)


@pytest.mark.parametrize(
    ("store", "operation"),
    [(_DropsStepsOnExtend, "extend"), (_DropsStepsOnRelease, "release")],
    ids=["extend", "release"],
)
def test_a_store_that_drops_steps_is_caught(store: Any, operation: str) -> None:
    with pytest.raises(SimulationFailure) as caught:
        simulate(store, range(2000), shrink=False)
    assert any(v.startswith(f"store: {operation}") for v in caught.value.violations)
    # The ledger sees it too, whatever the store checks say: a step that ran again while
    # its recovery point should have lived on the record.
    for seed in range(300):
        violations = run_one(generate(seed), store)
        if any(v.startswith("steps:") and "ran" in v for v in violations):
            return
    pytest.fail(f"no seed of 300 showed a step run again on a store losing steps on {operation}")


# -- the oracle judges steps by the ledger -------------------------------------------------


def _manager(**changes: Any) -> ManagerPlan:
    return dataclasses.replace(
        ManagerPlan(0.0, False, 1.0, None, 0.0, 3600.0, False, None), **changes
    )


def _trace(scenario: Scenario) -> Any:
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(run_scenario(scenario, MemoryStore()))
    finally:
        loop.close()


def test_a_mismatched_retry_raises_and_runs_nothing() -> None:
    # Call 0 records s0, s1 and fails; call 1 asks for another step at position 2.
    first = CallPlan(0, 0, 1, 0.0, "timeout", 3.0, "return", 0.2, None, steps=2)
    first = dataclasses.replace(first, step_fault="raise_after", step_at=1)
    retry = dataclasses.replace(first, manager=1, at=1.0, step_fault="mismatch")
    scenario = Scenario(11, True, (_manager(), _manager()), (first, retry))
    trace = _trace(scenario)
    assert isinstance(trace.outcomes[1].error, StepMismatchError)
    assert [taken.ran for taken in trace.outcomes[1].runs[0].steps] == [False, False]
    assert check(trace) == []
    # As if the library had run the replayed step instead: the oracle sees it.
    trace.outcomes[1].runs[0].steps[0].ran = True
    assert any("a recorded step never runs again" in v for v in check(trace))


def test_an_interrupted_step_runs_again_only_after_its_lease() -> None:
    # Call 0's second recovery point fails: the key is left to its 3 s lease.  Call 1
    # comes before it ends (refused), call 2 after (it runs s1 again: allowed, once).
    first = CallPlan(0, 0, 1, 0.0, "timeout", 3.0, "return", 0.2, None, steps=2)
    first = dataclasses.replace(first, faults=(Fault("record_step", 1, "error"),))
    early = CallPlan(1, 0, 1, 1.0, "timeout", 1.0, "return", 0.0, None, steps=2)
    late = dataclasses.replace(early, at=4.0, timeout=2.0)
    scenario = Scenario(12, True, (_manager(), _manager()), (first, early, late))
    trace = _trace(scenario)
    assert isinstance(trace.outcomes[0].error, StepNotRecordedError)
    assert type(trace.outcomes[1].error).__name__ == "AlreadyInProgressError"
    assert trace.outcomes[2].error is None
    ran = [(taken.call, taken.name) for taken in trace.steps if taken.ran]
    assert ran == [(0, "s0"), (0, "s1"), (2, "s1")]
    assert check(trace) == []
    # Had the retry run the step before the first holder's lease ended, it is caught.
    again = next(t for t in trace.steps if t.call == 2 and t.ran)
    again.started = 2.0
    assert any("before the first holder's lease ended" in v for v in check(trace))
