"""Running one scenario: managers on a shared faulty store, calls as tasks, a ledger.

The doors and the simulated callbacks are in ``_doors`` (and ``_http_door``); what a run
leaves for the oracle is in ``_trace``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

from idempotency_async.errors import ConfigError
from idempotency_async.manager import Manager
from idempotency_async.options import LocalCache, Options, Renewal, Wait
from idempotency_async.stores.base import Store
from idempotency_async.testing._doors import bounds_of, door, message_key
from idempotency_async.testing._faults import CALL, FaultyStore, ServerClockStore
from idempotency_async.testing._http_door import http_door, http_key, meaning
from idempotency_async.testing._plans import CallPlan, ManagerPlan, Scenario
from idempotency_async.testing._trace import (
    BASE_TIME,
    MISSING,
    CallbackExit,
    CallbackFailed,
    HttpAnswer,
    Outcome,
    Run,
    Trace,
    Unstorable,
)

__all__ = [
    "BASE_TIME",
    "CallbackExit",
    "CallbackFailed",
    "HttpAnswer",
    "Outcome",
    "Run",
    "Trace",
    "Unstorable",
    "clock_offset",
    "run_scenario",
]

_LAG_SAMPLE = 0.01
"""Real time: how often (seconds) the loop's lag is sampled."""


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
        loop.set_task_factory(_recording(created))
    faulty = FaultyStore(
        store,
        {i: call.faults for i, call in enumerate(scenario.calls)},
        {i: call.latency for i, call in enumerate(scenario.calls) if call.latency},
    )
    front: Store = faulty
    if scenario.server_clock and not own_clock:
        front = ServerClockStore(faulty, lambda: base + loop.time() - start)
    managers: list[Manager | None] = []
    refused: dict[int, BaseException] = {}
    for index in range(len(scenario.managers)):
        try:
            managers.append(_manager(scenario, index, front, start, base, namespace))
        except ConfigError as exc:
            managers.append(None)
            refused[index] = exc
    keying = Manager(front, _options(scenario, scenario.managers[0], namespace, time.time, True))
    keys: dict[int, str] = {}
    for call in scenario.calls:
        if call.key is not None and call.key not in keys:
            key = keying.key_for({"id": call.key})
            assert key is not None
            keys[call.key] = key
    trace = Trace(scenario, faulty, managers, keys, start, [], [], base=base, own_clock=own_clock)
    trace.refused = refused
    tasks: list[asyncio.Task[None]] = []
    sampler = asyncio.create_task(_sample_lag(trace)) if real_time else None
    with quiet_library():
        for index, call in enumerate(scenario.calls):
            manager = managers[call.manager]
            if call.key is None:
                continue
            if call.door == "http" and manager is not None:
                trace.call_keys[index] = http_key(trace, call.manager, manager, call.key)
            elif call.door == "batch" and call.by_message and manager is not None:
                key = message_key(trace, index, manager, call)
                assert key is not None
                trace.call_keys[index] = key
            else:
                trace.call_keys[index] = keys[call.key]
        try:
            for index, plan in enumerate(scenario.calls):
                delay = start + plan.at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                outcome = Outcome(index, loop.time(), None, faulty.applied)
                trace.outcomes.append(outcome)
                if managers[plan.manager] is None:
                    outcome.skipped = True
                    outcome.exited = outcome.entered
                    continue
                task = asyncio.create_task(_drive(trace, index, plan, outcome, epilogue))
                tasks.append(task)
                if plan.cancel_after is not None:
                    loop.call_later(plan.cancel_after, _cancel, task, outcome, faulty, loop)
            pending: set[asyncio.Task[None]] = set()
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=stuck_after)
            trace.unfinished = sorted(
                outcome.call for outcome in trace.outcomes if outcome.exited is None
            )
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
            while faulty.late:
                landing, faulty.late = faulty.late, []
                done, _ = await asyncio.wait(landing)
                for task in done:
                    if not task.cancelled():
                        task.exception()  # retrieved: a request that landed and failed
            await _probe(trace, start)
        finally:
            if sampler is not None:
                sampler.cancel()
                await asyncio.wait((sampler,))
    if epilogue:
        # One scenario per loop (virtual time): any task of the library left is this
        # scenario's.  Live runs share their loop between scenarios, and skip the check.
        trace.leftover_tasks = _library_tasks(created)
    return trace


def _recording(created: list[asyncio.Task[Any]]) -> Any:
    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        created.append(task)
        return task

    return factory


async def _sample_lag(trace: Trace) -> None:
    """Real time: record how late the loop wakes a short timer, all along the scenario (a
    busy machine delays every timer; no timing verdict may blame the library for that)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + _LAG_SAMPLE
        await asyncio.sleep(_LAG_SAMPLE)
        now = loop.time()
        trace.lags.append((now, max(0.0, now - due)))


_quiet_depth = 0
_saved_level = logging.NOTSET


@contextlib.contextmanager
def quiet_library() -> Iterator[None]:
    """Silence the library's warnings while scenarios run (they log on purpose); nested
    and concurrent scenarios restore the level once, when the last one ends."""
    global _quiet_depth, _saved_level
    logger = logging.getLogger("idempotency_async")
    if _quiet_depth == 0:
        _saved_level = logger.level
        logger.setLevel(logging.CRITICAL)
    _quiet_depth += 1
    try:
        yield
    finally:
        _quiet_depth -= 1
        if _quiet_depth == 0:
            logger.setLevel(_saved_level)


def clock_offset(plan: ManagerPlan, loop_time: float) -> float:
    """How far the process's wall clock is ahead of true time at ``loop_time``: its skew,
    plus its jump once the jump happened."""
    if plan.jump_at is not None and loop_time >= plan.jump_at:
        return plan.skew + plan.jump
    return plan.skew


def _options(
    scenario: Scenario, plan: ManagerPlan, namespace: str, clock: Any, keying: bool = False
) -> Options:
    renew = plan.renew_lease
    renewal = None if keying or renew is None else Renewal(lease=renew, every=plan.renew_every)
    return Options(
        key_prefix=f"sim{scenario.seed}{namespace}",
        event_key_jmespath="id",
        payload_validation_jmespath="amount" if scenario.validate else None,
        expires_after=plan.expires_after,
        lease=plan.lease,
        lease_margin=plan.lease_margin,
        completion_reserve=None if keying else plan.completion_reserve,
        renewal=renewal,
        wait=Wait(timeout=plan.wait_timeout) if plan.wait else None,
        local_cache=LocalCache() if plan.use_local_cache else None,
        clock=clock,
    )


def _manager(
    scenario: Scenario, index: int, store: Store, start: float, base: float, namespace: str
) -> Manager:
    plan = scenario.managers[index]
    loop = asyncio.get_running_loop()
    offset = base - start

    def clock() -> float:
        now = loop.time()
        return offset + now + clock_offset(plan, now - start)

    return Manager(store, _options(scenario, plan, namespace, clock))


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
        else:
            enter = door(trace, index, plan, outcome, manager)
        async with bounds.entered():
            value = await enter(bounds)
        if plan.door == "http":
            outcome.http = value
            outcome.value, outcome.error = meaning(value, outcome)
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


def _library_tasks(created: list[asyncio.Task[Any]]) -> list[str]:
    """Pending tasks running the library's own coroutines (none may outlive a call), of
    those the scenario's loop created (cheaper than ``asyncio.all_tasks``, which walks
    every task not yet collected)."""
    found: list[str] = []
    for task in created:
        if task.done():
            continue
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None)
        filename = getattr(code, "co_filename", "")
        if "idempotency_async" in filename and "testing" not in filename:
            found.append(repr(task))
    return found


def describe_trace(trace: Trace) -> str:
    """The store's log, the callback runs and the outcomes, as text (``--verbose``)."""
    start = trace.start
    lines = ["store operations (t = seconds from the scenario start):"]
    for op in trace.store.ops:
        arg = op.arg
        if hasattr(arg, "owner"):
            arg = f"owner={arg.owner} now={arg.now - BASE_TIME:.3f}"
        fault = "" if op.fault is None else f" FAULT={op.fault.kind}"
        ended = "-" if op.ended is None else f"{op.ended - start:.3f}"
        got = op.raised if op.raised is not None else op.delivered
        lines.append(
            f"  #{op.seq} t={op.started - start:.3f}..{ended} call {op.call} {op.name} "
            f"{op.key} {arg}{fault} -> {got!r}"
        )
        for application in op.applications:
            lines.append(
                f"      applied t={application.at - start:.3f}: {application.before} "
                f"=> {application.after}"
            )
    lines.append("callbacks:")
    for run in trace.runs:
        ended = "-" if run.ended is None else f"{run.ended - start:.3f}"
        lines.append(
            f"  call {run.call} owner={run.owner} t={run.started - start:.3f}..{ended} "
            f"returned={run.returned} cancelled={run.cancelled} "
            f"swallowed={run.swallowed} blocked={run.blocked}"
        )
    lines.append("outcomes:")
    for outcome in trace.outcomes:
        got = outcome.value if outcome.error is None else repr(outcome.error)
        exited = "-" if outcome.exited is None else f"{outcome.exited - start:.3f}"
        lines.append(f"  call {outcome.call} t={outcome.entered - start:.3f}..{exited} -> {got}")
    return "\n".join(lines)
