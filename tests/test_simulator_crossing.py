"""The simulator crosses features (issue "Where features meet"): its axes and their
covering array, the coverage a run reports, an oracle that judges against the plan, and
reproducers that reproduce — a real-time failure's included, whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from idempotency_async import MemoryStore
from idempotency_async.record import Claim
from idempotency_async.stores.base import Verdict
from idempotency_async.testing import (
    CallPlan,
    ManagerPlan,
    Scenario,
    SimulationFailure,
    generate,
    run_live,
    run_one,
    simulate_live,
)
from idempotency_async.testing._axes import (
    AXES,
    TRIPLES,
    conflict,
    covering_rows,
    feasible_pairs,
    pair,
    pairs_of,
    triples_of,
)
from idempotency_async.testing._coverage import call_values, coverage_of
from idempotency_async.testing._oracle import check
from idempotency_async.testing._run import run_scenario
from idempotency_async.testing._vloop import VirtualClockLoop

# -- axes and the covering array ----------------------------------------------------------


def test_the_covering_rows_cross_every_pair_that_can_meet_and_each_named_triple() -> None:
    rows = covering_rows()
    crossed = {pair for row in rows for pair in pairs_of(row)}
    assert feasible_pairs() <= crossed
    for row in rows:
        assert conflict(row) is None, row
    for name in TRIPLES:
        events = [set(row.get("event", "").split(",")) for row in rows]
        assert any(name in triples_of(row, ev) for row, ev in zip(rows, events, strict=True))
    # Far fewer rows than pairs: the point of directing the generator.
    assert len(rows) < len(feasible_pairs()) / 5


def test_pairs_that_cannot_meet_are_told_apart_with_a_reason() -> None:
    assert conflict({"door": "operator", "place": "claim"}) is not None
    assert conflict({"renewal": "off", "place": "extend"}) is not None
    assert conflict({"door": "batch", "deadline": "lambda"}) is None
    assert conflict({"door": "http", "outcome": "stream", "renewal": "on"}) is None
    every = sum(
        len(AXES[a]) * len(AXES[b]) for i, a in enumerate(AXES) for b in list(AXES)[i + 1 :]
    )
    # Most pairs can meet; the rules rule out a minority.
    assert 0.75 * every < len(feasible_pairs()) < every


def test_steps_meet_every_other_axis() -> None:
    # Every steps value meets every value of the axes no rule ties it to, and the rules
    # that do are named: a failing step ends the callback (it raises, or crashes there).
    pairs = feasible_pairs()
    for value in AXES["steps"]:
        for axis in ("renewal", "cache", "clock", "skew", "redaction", "deadline"):
            for other in AXES[axis]:
                assert pair("steps", value, axis, other) in pairs, (value, axis, other)
        doors = {door for door in AXES["door"] if pair("steps", value, "door", door) in pairs}
        assert doors >= {"execute", "decorated", "batch", "http", "mcp", "route"}, value
    assert pair("steps", "run", "outcome", "declared") in pairs
    assert pair("place", "record_step", "steps", "crash_in") in pairs
    assert conflict({"door": "operator", "steps": "run"}) is not None
    assert conflict({"steps": "raise_in", "outcome": "return"}) is not None
    assert conflict({"steps": "mismatch", "place": "record_step"}) is not None


def test_each_seed_makes_one_call_realize_its_row() -> None:
    rows = covering_rows()
    for seed in range(len(rows)):
        row = rows[seed % len(rows)]
        scenario = generate(seed)
        values = [call_values(scenario, index) for index in range(len(scenario.calls))]
        wanted = {
            axis: value for axis, value in row.items() if axis not in ("fault", "place", "event")
        }
        if "clock" in wanted and wanted["clock"] != (
            "server" if scenario.server_clock else "client"
        ):
            pytest.fail(f"seed {seed}: the store's clock is not the row's {row}")
        wanted.pop("clock", None)
        if "event" in row:
            # A named triple's row: what makes its events happen may override the rest.
            wanted = {axis: wanted[axis] for axis in ("door", "renewal") if axis in wanted}
        assert any(all(v.get(a) == x for a, x in wanted.items()) for v in values), (seed, row)
        if row["fault"] != "none":
            planned = {(f.kind, f.op) for call in scenario.calls for f in call.faults}
            assert (row["fault"], row["place"]) in planned, (seed, row)


def test_a_fault_counts_where_it_fired_not_where_it_was_planned() -> None:
    # A fault on a completion that never comes (the callback raises) crosses nothing.
    manager = ManagerPlan(0.0, False, 1.0, None, 0.0, 3600.0, False, None)
    call = CallPlan(0, 0, 1, 0.0, "timeout", 2.0, "raise", 0.1, None)
    faulted = dataclasses.replace(
        call, faults=(dataclasses.replace(_fault("complete"), kind="delay", seconds=0.5),)
    )
    scenario = Scenario(1, False, (manager,), (faulted,))
    coverage = coverage_of(_trace(scenario))
    assert (("fault", "none"), ("place", "none")) in coverage.pairs
    assert (("fault", "delay"), ("place", "complete")) not in coverage.pairs


def _fault(op: str) -> Any:
    from idempotency_async.testing import Fault

    return Fault(op, 0, "error")


def _trace(scenario: Scenario) -> Any:
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(run_scenario(scenario, MemoryStore()))
    finally:
        loop.close()


# -- the oracle judges against the plan ------------------------------------------------


def _plain_manager(**changes: Any) -> ManagerPlan:
    return dataclasses.replace(
        ManagerPlan(0.0, False, 1.0, None, 0.0, 3600.0, False, None), **changes
    )


def test_a_lease_that_ignores_the_call_s_deadline_is_seen() -> None:
    scenario = Scenario(
        2,
        False,
        (_plain_manager(),),
        (CallPlan(0, 0, 1, 0.0, "timeout", 3.0, "return", 0.1, None),),
    )
    trace = _trace(scenario)
    assert check(trace) == []
    # The plan said 3 s; as if the library had taken the lease from elsewhere (say, the
    # `lease` option or the expiry): the claim no longer matches the call's deadline.
    trace.outcomes[0].deadline = trace.outcomes[0].entered + 2.0
    assert any(v.startswith("lease:") for v in check(trace))


def test_only_an_operator_s_force_release_is_exempt() -> None:
    calls = (
        CallPlan(0, 0, 1, 0.0, "timeout", 5.0, "return", 2.0, None),
        CallPlan(1, 0, 1, 0.5, "none", 1.0, "return", 0.0, None, door="operator"),
    )
    scenario = Scenario(3, False, (_plain_manager(), _plain_manager()), calls)
    trace = _trace(scenario)
    assert check(trace) == []
    # The same release, sent by a call that is not an operator's.
    trace.scenario = dataclasses.replace(
        scenario, calls=(calls[0], dataclasses.replace(calls[1], door="execute"))
    )
    assert any("no operator's" in v for v in check(trace))


def test_an_in_process_refusal_is_held_to_its_holder() -> None:
    # Two calls of one process, the second while the first holds the key: refused.
    calls = (
        CallPlan(0, 0, 1, 0.0, "timeout", 5.0, "return", 2.0, None),
        CallPlan(0, 0, 1, 0.5, "timeout", 5.0, "return", 0.0, None),
    )
    scenario = Scenario(4, True, (_plain_manager(),), calls)
    trace = _trace(scenario)
    assert type(trace.outcomes[1].error).__name__ == "AlreadyInProgressError"
    assert check(trace) == []
    # With another payload it must have been told so first (validation before refusal).
    other = dataclasses.replace(calls[1], amount=2)
    trace.scenario = dataclasses.replace(scenario, calls=(calls[0], other))
    assert any("payload differs from the holder's" in v for v in check(trace))
    # With no holder in its process, there was nothing to refuse it for.
    trace.scenario = dataclasses.replace(
        scenario,
        managers=(_plain_manager(), _plain_manager()),
        calls=(dataclasses.replace(calls[0], manager=1), calls[1]),
    )
    assert any("no holder of its key" in v for v in check(trace))


# -- reproducers reproduce; real-time verdicts do not depend on the load -----------------


class _ShortLived(MemoryStore):
    """A store bug every scenario meets at its first claim: it writes records that expire
    after one second, whatever the TTL asked (so real time reproduces it every time)."""

    async def claim(self, claim: Claim) -> Verdict:
        return await super().claim(claim._replace(ttl=1.0))


async def test_a_real_time_failure_prints_a_reproducer_of_its_own_scenario() -> None:
    with pytest.raises(SimulationFailure) as caught:
        await simulate_live(_ShortLived, range(20), scale=0.05, concurrency=4, tolerance=0.5)
    failure = caught.value
    text = str(failure)
    # The seed's rerun generates this very scenario (a real-time run's: --live)...
    rerun = failure.rerun.split()
    assert "--live" in rerun and rerun[rerun.index("--seed") + 1] == str(failure.seed)
    assert generate(failure.seed, scale=0.05, live=True) == failure.scenario
    # ...and the scenario itself is printed, to run again in virtual time or in real time
    # with its faults.
    assert f"--scenario '{failure.scenario.to_json()}'" in text
    assert "run_live(" in text
    assert Scenario.from_json(failure.scenario.to_json()) == failure.scenario
    again = await run_live(_ShortLived, failure.scenario, tolerance=0.5)
    assert any(v.startswith("store: claim") for v in again), again
    # ...and in virtual time (its own loop: in a thread).
    virtual = await asyncio.to_thread(run_one, failure.scenario, _ShortLived)
    assert any(v.startswith("store: claim") for v in virtual), virtual


async def test_a_late_loop_is_not_blamed_on_the_library() -> None:
    # A callback that hangs until its cutoff (0.3 s deadline, cut off at 0.24 s), while
    # something else blocks the loop from 0.2 s to 0.5 s, as a loaded machine would: the
    # cutoff fires late.  The verdict must not change with the load.
    manager = _plain_manager()
    call = CallPlan(0, 0, 1, 0.0, "timeout", 0.3, "hang", 0.1, None)
    scenario = Scenario(5, False, (manager,), (call,), live=True)

    async def load() -> None:
        await asyncio.sleep(0.2)
        time.sleep(0.3)  # noqa: ASYNC251 - blocks the loop: every timer due fires late

    blocker = asyncio.create_task(load())
    trace = await run_scenario(
        scenario, MemoryStore(), stuck_after=5.0, epilogue=False, real_time=True
    )
    await blocker
    assert check(trace, tolerance=0.02) == []
    # Without the loop's lag the same trace reads as a holder cut off too late: the check
    # can fail, and only the measured lag excuses it.
    trace.lags.clear()
    assert any("after its cutoff" in v for v in check(trace, tolerance=0.02))


def test_a_livelock_is_told_by_counting_not_by_the_clock() -> None:
    # Two tasks waking each other forever: the virtual loop gives up after its iteration
    # budget — the same verdict on a busy machine and a quiet one (a real-time limit once
    # failed a seed of CI under load).
    from idempotency_async.testing._vloop import Deadlock

    loop = VirtualClockLoop(iteration_limit=1_000)

    async def ping(event: asyncio.Event, other: asyncio.Event) -> None:
        while True:
            await event.wait()
            event.clear()
            other.set()

    async def main() -> None:
        one, two = asyncio.Event(), asyncio.Event()
        one.set()
        await asyncio.gather(ping(one, two), ping(two, one))

    try:
        with pytest.raises(Deadlock, match="1,000 loop iterations"):
            loop.run_until_complete(main())
        assert loop.iterations == 1_001
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.close()
