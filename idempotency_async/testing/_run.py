"""Running one scenario: the processes' managers on a shared faulty store, each call a
task started at its planned time (cancelled when its plan says so), then a probe of every
key once every lease could have ended.

The processes are built in ``_managers``; the doors and the simulated callbacks are in
``_doors`` (and ``_http_door``); the loop is watched by ``_watch``; what a run leaves for
the oracle is in ``_trace``.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from idempotency_async.stores.base import RecordsSteps, Store
from idempotency_async.testing._doors import bounds_of, door, message_key
from idempotency_async.testing._faults import CALL, FaultyStore, ServerClockStore
from idempotency_async.testing._http_door import http_door, http_key, meaning
from idempotency_async.testing._managers import managers_of, plain_keys
from idempotency_async.testing._plans import CallPlan, Scenario
from idempotency_async.testing._quiet import quiet_library
from idempotency_async.testing._trace import BASE_TIME, MISSING, Outcome, Trace
from idempotency_async.testing._watch import library_tasks, recording, sample_lag

__all__ = ["run_scenario"]


async def run_scenario(
    scenario: Scenario,
    store: Store,
    *,
    stuck_after: float = 100_000.0,
    epilogue: bool = True,
    own_clock: bool = False,
    namespace: str = "",
    real_time: bool = False,
) -> Trace:
    """Run ``scenario`` against ``store`` on the running loop; return its trace.

    A call still running ``stuck_after`` seconds after the last one started counts as stuck.
    ``epilogue``: after its call, each caller goes on with code of its own until its lease
    could have ended, to see whether the call left something behind that interrupts it.
    ``own_clock``: a server-clock scenario runs against a store that judges by a real clock
    of its own (Redis ``TIME``): true time is then the real wall clock.  ``namespace`` goes
    into the keys (runs sharing a server's keyspace).  ``real_time``: the loop's lag is
    sampled all along, so no timing verdict blames the library for a late loop.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    base = time.time() if own_clock else BASE_TIME
    created: list[asyncio.Task[Any]] = []
    if epilogue:
        # One scenario per loop (virtual time): the tasks it creates are the scenario's.
        loop.set_task_factory(recording(created))
    faulty = FaultyStore(
        store,
        {i: call.faults for i, call in enumerate(scenario.calls)},
        {i: call.latency for i, call in enumerate(scenario.calls) if call.latency},
    )
    front: Store = faulty
    if scenario.server_clock and not own_clock:
        front = ServerClockStore(faulty, lambda: base + loop.time() - start)
    managers, refused = managers_of(scenario, front, start, base, namespace)
    keys = plain_keys(scenario, front, namespace)
    trace = Trace(scenario, faulty, managers, keys, start, [], [], base=base, own_clock=own_clock)
    trace.refused = refused
    trace.records_steps = isinstance(store, RecordsSteps)
    sampler = asyncio.create_task(sample_lag(trace)) if real_time else None
    with quiet_library():
        _key_calls(trace)
        try:
            tasks = await _start_calls(trace, epilogue)
            await _ended(trace, tasks, stuck_after)
            await _landed(faulty)
            await _probe(trace, start)
        finally:
            if sampler is not None:
                sampler.cancel()
                await asyncio.wait((sampler,))
    if epilogue:
        # One scenario per loop (virtual time): any task of the library left is this
        # scenario's.  Live runs share their loop between scenarios, and skip the check.
        trace.leftover_tasks = library_tasks(created)
    return trace


def _key_calls(trace: Trace) -> None:
    """The store key of each call with a key: an HTTP request's and a batch's keyed by
    message differ from a plain call's of the same key index."""
    for index, call in enumerate(trace.scenario.calls):
        manager = trace.managers[call.manager]
        if call.key is None:
            continue
        if call.door == "http" and manager is not None:
            trace.call_keys[index] = http_key(trace, call.manager, manager, call.key)
        elif call.door in _PEERS and manager is not None:
            key = _peer(call.door)[1](manager, call)
            assert key is not None
            trace.call_keys[index] = key
        elif call.door == "batch" and call.by_message and manager is not None:
            key = message_key(trace, index, manager, call)
            assert key is not None
            trace.call_keys[index] = key
        else:
            trace.call_keys[index] = trace.keys[call.key]


_PEERS = frozenset({"mcp", "route"})
"""The peer doors: an MCP tool, a Powertools route."""


def _peer(name: str) -> tuple[Any, Any, Any]:
    """How the peer door ``name`` enters, the key it uses and what its answer means —
    imported when a scenario first uses it: the MCP SDK and Powertools are optional."""
    if name == "mcp":
        from idempotency_async.testing._mcp_door import mcp_door, mcp_key, mcp_meaning

        return mcp_door, mcp_key, mcp_meaning
    from idempotency_async.testing._route_door import route_door, route_key, route_meaning

    return route_door, route_key, route_meaning


async def _start_calls(trace: Trace, epilogue: bool) -> list[asyncio.Task[None]]:
    """Start each call as a task at its planned time (its cancellation scheduled when its
    plan has one); a call of a process whose manager was refused is skipped."""
    loop = asyncio.get_running_loop()
    faulty = trace.store
    tasks: list[asyncio.Task[None]] = []
    for index, plan in enumerate(trace.scenario.calls):
        delay = trace.start + plan.at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        outcome = Outcome(index, loop.time(), None, faulty.applied)
        trace.outcomes.append(outcome)
        if trace.managers[plan.manager] is None:
            outcome.skipped = True
            outcome.exited = outcome.entered
            continue
        task = asyncio.create_task(_drive(trace, index, plan, outcome, epilogue))
        tasks.append(task)
        if plan.cancel_after is not None:
            loop.call_later(plan.cancel_after, _cancel, task, outcome, faulty, loop)
    return tasks


async def _ended(trace: Trace, tasks: list[asyncio.Task[None]], stuck_after: float) -> None:
    """Wait for the calls to end; those still running ``stuck_after`` seconds after the
    last one started are stuck: noted, then cancelled."""
    pending: set[asyncio.Task[None]] = set()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=stuck_after)
    trace.unfinished = sorted(outcome.call for outcome in trace.outcomes if outcome.exited is None)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)


async def _landed(faulty: FaultyStore) -> None:
    """Wait for the requests still on their way to the store (sent by calls that ended)."""
    while faulty.late:
        landing, faulty.late = faulty.late, []
        done, _ = await asyncio.wait(landing)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: a request that landed and failed


def _cancel(
    task: asyncio.Task[None], outcome: Outcome, store: FaultyStore, loop: asyncio.AbstractEventLoop
) -> None:
    if not task.done() and outcome.exited is None:
        outcome.cancel_requested = loop.time()
        outcome.cancel_seq = len(store.ops)
        task.cancel()


async def _drive(
    trace: Trace, index: int, plan: CallPlan, outcome: Outcome, epilogue: bool
) -> None:
    CALL.set(index)
    loop = asyncio.get_running_loop()
    manager = trace.managers[plan.manager]
    assert manager is not None
    try:
        if plan.door == "operator":
            assert plan.key is not None
            outcome.value = await manager.force_release(trace.keys[plan.key])
            return
        bounds, outcome.deadline = bounds_of(plan, loop.time())
        if plan.door == "http":
            enter = http_door(trace, index, plan, outcome, manager)
        elif plan.door in _PEERS:
            enter = _peer(plan.door)[0](trace, index, plan, outcome, manager)
        else:
            enter = door(trace, index, plan, outcome, manager)
        async with bounds.entered():
            value = await enter(bounds)
        if plan.door == "http":
            outcome.http = value
            outcome.value, outcome.error = meaning(value, outcome)
            if outcome.error is not None:
                outcome.value = MISSING
        elif plan.door == "mcp":
            outcome.answer = value
            outcome.value, outcome.error = _peer("mcp")[2](value, outcome)
            if outcome.error is not None:
                outcome.value = MISSING
        elif plan.door == "route":
            outcome.http = value
            outcome.value, outcome.error = _peer("route")[2](value, outcome)
            if outcome.error is not None:
                outcome.value = MISSING
        else:
            outcome.value = value
    except BaseException as exc:  # the outcome is the subject under test
        outcome.error = exc
    finally:
        outcome.exited = loop.time()
        outcome.exited_at = trace.store.applied
        outcome.in_flight = tuple(
            op.seq for op in trace.store.ops if op.call == index and op.ended is None
        )
    if epilogue:
        await _go_on(trace, plan, outcome)


async def _go_on(trace: Trace, plan: CallPlan, outcome: Outcome) -> None:
    """The caller's own code after the call: it runs until the call's lease could have
    ended, and nothing the call left behind may interrupt it."""
    manager = trace.scenario.managers[plan.manager]
    if plan.deadline == "none" and not plan.also:
        until = manager.lease if manager.lease is not None else manager.expires_after
    else:
        until = max(seconds for _, seconds in ((plan.deadline, plan.timeout), *plan.also))
    if not math.isfinite(until):
        return
    try:
        await asyncio.sleep(until + 1.0)
    except BaseException as exc:  # what interrupted the caller's own code
        outcome.stray = exc


async def _probe(trace: Trace, start: float) -> None:
    """After the last call: wait past every lease, then ask the store about each key."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    for op in trace.store.ops:
        if op.name in ("claim", "extend"):
            # The lease counts from when the claim was sent (a store's own clock: from when
            # it applied the claim — any time until its answer came back, however slow),
            # whatever the sender's clock.
            for application in op.applications:
                applied = application.until if application.until is not None else application.at
                last = max(last, applied + op.arg.lease)
            last = max(last, op.started + op.arg.lease)
    await asyncio.sleep(max(0.0, last - loop.time()) + (0.05 if trace.own_clock else 0.01))
    ahead = 0.0
    if not trace.scenario.server_clock:
        # Ahead of every clock that ever wrote a lease (a clock that jumped back wrote
        # some while it was ahead).
        ahead = max(max(plan.skew, plan.skew + plan.jump) for plan in trace.scenario.managers)
    now = trace.base + loop.time() - start + ahead
    trace.probed_at = now
    for key in sorted({*trace.keys.values(), *trace.call_keys.values()}):
        trace.probes[key] = await trace.store.inner.get(key, now=now)
