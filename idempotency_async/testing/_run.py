"""Running one scenario: managers on a shared faulty store, calls as tasks, a ledger."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from idempotency_async import Call
from idempotency_async.deadlines import deadline as ambient_deadline
from idempotency_async.decorators import idempotent_function
from idempotency_async.integrations.aws_lambda import process_batch
from idempotency_async.manager import Manager
from idempotency_async.options import Options
from idempotency_async.stores.base import Store
from idempotency_async.testing._faults import CALL, FaultyStore, ServerClockStore
from idempotency_async.testing._scenario import CallPlan, ManagerPlan, Scenario

__all__ = [
    "BASE_TIME",
    "CallbackExit",
    "CallbackFailed",
    "Outcome",
    "Run",
    "Trace",
    "clock_offset",
    "run_scenario",
]

BASE_TIME = 1_700_000_000.0
"""Unix time at loop time 0 (each manager's clock adds its skew)."""

_MISSING: Any = object()


class CallbackFailed(Exception):
    """What a simulated callback raises (its own exception, to be re-raised to the caller)."""


class CallbackExit(BaseException):
    """What a simulated callback raises for a ``BaseException`` that is no ``Exception``
    (as ``sys.exit`` or a test framework's ``fail()`` would)."""


_FALSY: tuple[Any, ...] = (0, "", [], False, None)


class Unstorable:
    """A callback result that is not JSON: its record completes without a response."""

    def __init__(self, call: int) -> None:
        self.call = call

    def __repr__(self) -> str:
        return f"Unstorable({self.call})"


@dataclass(slots=True)
class Run:
    """One start of a callback, and how it ended."""

    call: int
    owner: str | None
    started: float
    ended: float | None = None
    returned: bool = False
    value: Any = None
    error: BaseException | None = None
    cancelled: bool = False
    swallowed: bool = False
    blocked: bool = False
    answered: float | None = None
    """``execute_call``: when the callback completed the record through its ``Call``
    (its point of no return)."""


@dataclass(slots=True)
class Outcome:
    """What one caller got."""

    call: int
    entered: float
    deadline: float | None
    entered_at: int = 0
    """How many store applications had happened when the call started."""
    exited: float | None = None
    exited_at: int = 0
    value: Any = _MISSING
    error: BaseException | None = None
    cancel_requested: float | None = None
    cancel_seq: int | None = None
    runs: list[Run] = field(default_factory=list)
    stray: BaseException | None = None
    """What interrupted the caller's own code after the call had returned (a cutoff left
    armed cancels unrelated code)."""

    @property
    def returned_value(self) -> bool:
        return self.value is not _MISSING


@dataclass(slots=True)
class Trace:
    """Everything a scenario did: the store's log, the callbacks, the callers' outcomes."""

    scenario: Scenario
    store: FaultyStore
    managers: list[Manager]
    keys: dict[int, str]
    start: float
    outcomes: list[Outcome]
    runs: list[Run]
    unfinished: list[int] = field(default_factory=list)
    leftover_tasks: list[str] = field(default_factory=list)
    probes: dict[str, Any] = field(default_factory=dict)
    probed_at: float = 0.0
    base: float = BASE_TIME
    """Unix time at the scenario's start, in true time."""
    own_clock: bool = False
    """The store judged by a real clock of its own (true time: the machine's clock)."""
    pauses: list[tuple[float, float]] = field(default_factory=list)
    """Loop-time intervals during which a callback blocked the loop (every manager shares
    it, so each one paused)."""

    def paused_during(self, start: float, end: float | None) -> bool:
        return any(start <= until and (end is None or end >= since) for since, until in self.pauses)


def _exited(trace: Trace, task: asyncio.Task[None]) -> bool:
    return False


async def run_scenario(
    scenario: Scenario,
    store: Store,
    *,
    stuck_after: float = 100_000.0,
    epilogue: bool = True,
    own_clock: bool = False,
    namespace: str = "",
) -> Trace:
    """Run ``scenario`` against ``store`` on the running loop; return its trace.

    A call still running ``stuck_after`` seconds after the last one started counts as stuck.
    ``epilogue``: after its call, each caller goes on with code of its own until its lease
    could have ended, to see whether the call left something behind that interrupts it.
    ``own_clock``: a server-clock scenario runs against a store that judges by a real clock
    of its own (Redis ``TIME``): true time is then the real wall clock.  ``namespace`` goes
    into the keys (runs sharing a server's keyspace).
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    base = time.time() if own_clock else BASE_TIME
    faulty = FaultyStore(store, {i: call.faults for i, call in enumerate(scenario.calls)})
    front: Store = faulty
    if scenario.server_clock and not own_clock:
        front = ServerClockStore(faulty, lambda: base + loop.time() - start)
    managers = [
        _manager(scenario, index, front, start, base, namespace)
        for index in range(len(scenario.managers))
    ]
    keys: dict[int, str] = {}
    for call in scenario.calls:
        if call.key is not None and call.key not in keys:
            key = managers[0].key_for({"id": call.key})
            assert key is not None
            keys[call.key] = key
    trace = Trace(scenario, faulty, managers, keys, start, [], [], base=base, own_clock=own_clock)
    tasks: list[asyncio.Task[None]] = []
    with quiet_library():
        for index, plan in enumerate(scenario.calls):
            delay = start + plan.at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            outcome = Outcome(index, loop.time(), None, faulty.applied)
            trace.outcomes.append(outcome)
            task = asyncio.create_task(_drive(trace, index, plan, outcome, epilogue))
            tasks.append(task)
            if plan.cancel_after is not None:
                loop.call_later(plan.cancel_after, _cancel, task, outcome, faulty, loop)
        _, pending = await asyncio.wait(tasks, timeout=stuck_after)
        trace.unfinished = [tasks.index(task) for task in pending if not _exited(trace, task)]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        if faulty.late:
            await asyncio.wait(faulty.late)
        await _probe(trace, start)
    if epilogue:
        # One scenario per loop (virtual time): any task of the library left is this
        # scenario's.  Live runs share their loop between scenarios, and skip the check.
        trace.leftover_tasks = _library_tasks()
    return trace


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


def _manager(
    scenario: Scenario, index: int, store: Store, start: float, base: float, namespace: str
) -> Manager:
    plan = scenario.managers[index]
    loop = asyncio.get_running_loop()
    offset = base - start

    def clock() -> float:
        now = loop.time()
        return offset + now + clock_offset(plan, now - start)

    options = Options(
        key_prefix=f"sim{scenario.seed}{namespace}",
        event_key_jmespath="id",
        payload_validation_jmespath="amount" if scenario.validate else None,
        expires_after=plan.expires_after,
        lease=plan.lease,
        lease_margin=plan.lease_margin,
        completion_reserve=plan.completion_reserve,
        renew_lease=plan.renew_lease,
        renew_every=plan.renew_every,
        wait=plan.wait,
        wait_timeout=plan.wait_timeout,
        use_local_cache=plan.use_local_cache,
        clock=clock,
    )
    return Manager(store, options)


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
    payload: dict[str, Any] = {"amount": plan.amount}
    if plan.key is not None:
        payload["id"] = plan.key
    try:
        if plan.door == "operator":
            assert plan.key is not None
            outcome.value = await manager.force_release(trace.keys[plan.key])
            return
        door = _door(trace, index, plan, outcome, manager, payload)
        if plan.deadline == "timeout":
            outcome.deadline = loop.time() + plan.timeout
            value = await door(timeout=plan.timeout)
        elif plan.deadline == "deadline":
            outcome.deadline = loop.time() + plan.timeout
            value = await door(deadline=outcome.deadline)
        elif plan.deadline == "ambient":
            outcome.deadline = loop.time() + plan.timeout
            async with ambient_deadline(plan.timeout):
                value = await door()
        else:
            value = await door()
        outcome.value = value
    except BaseException as exc:  # the outcome is the subject under test
        outcome.error = exc
    finally:
        outcome.exited = loop.time()
        outcome.exited_at = trace.store.applied
    if epilogue:
        await _go_on(trace, plan, outcome)


async def _go_on(trace: Trace, plan: CallPlan, outcome: Outcome) -> None:
    """The caller's own code after the call: it runs until the call's lease could have
    ended, and nothing the call left behind may interrupt it."""
    manager = trace.scenario.managers[plan.manager]
    if plan.deadline == "none":
        until = manager.lease if manager.lease is not None else manager.expires_after
    else:
        until = plan.timeout
    if not math.isfinite(until):
        return
    try:
        await asyncio.sleep(until + 1.0)
    except BaseException as exc:  # what interrupted the caller's own code
        outcome.stray = exc


Door = Callable[..., Awaitable[Any]]


def _door(
    trace: Trace,
    index: int,
    plan: CallPlan,
    outcome: Outcome,
    manager: Manager,
    payload: dict[str, Any],
) -> Door:
    """How the call enters the library: ``execute``, ``execute_call`` or a decorated
    function, with the callback in the plan's shape."""
    if plan.door == "execute_call":
        handled = _callback(trace, index, plan, outcome)

        def with_call(**bounds: Any) -> Awaitable[Any]:
            return manager.execute_call(payload, handled, **bounds)

        return with_call
    callback = _callback(trace, index, plan, outcome)
    if plan.door == "batch":

        async def batch(**bounds: Any) -> Any:
            # A batch's deadline is its Lambda context's (none here) or an ambient one:
            # a timeout or a deadline of the plan becomes an ambient deadline.
            records = [_sqs_record(f"m{index}-{copy}", payload) for copy in range(plan.copies)]

            async def handler(record: dict[str, Any]) -> Any:
                return await callback(None)

            event = {"Records": records}
            if "timeout" in bounds:
                async with ambient_deadline(bounds["timeout"]):
                    return await process_batch(manager, event, handler)
            if "deadline" in bounds:
                async with ambient_deadline(at=bounds["deadline"]):
                    return await process_batch(manager, event, handler)
            return await process_batch(manager, event, handler)

        return batch
    if plan.door == "decorated":

        def decorated(**bounds: Any) -> Awaitable[Any]:
            timeout = bounds.get("timeout")
            if "deadline" in bounds:
                timeout = bounds["deadline"] - asyncio.get_running_loop().time()

            @idempotent_function(manager, payload="event", timeout=timeout)
            async def function(event: dict[str, Any]) -> Any:
                return await callback(None)

            return function(payload)

        return decorated
    if plan.shape == "plain":
        plain = _plain(trace, index, plan, outcome)

        def with_plain(**bounds: Any) -> Awaitable[Any]:
            return manager.execute(payload, plain, **bounds)

        return with_plain
    if plan.shape == "lambda":

        def with_lambda(**bounds: Any) -> Awaitable[Any]:
            return manager.execute(payload, lambda: callback(None), **bounds)

        return with_lambda

    def with_coroutine(**bounds: Any) -> Awaitable[Any]:
        async def coroutine() -> Any:
            return await callback(None)

        return manager.execute(payload, coroutine, **bounds)

    return with_coroutine


def _sqs_record(message_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """An SQS record carrying ``payload`` (also at its top level, where the scenario's
    ``event_key_jmespath`` finds it)."""
    return {
        "messageId": message_id,
        "receiptHandle": f"handle-{message_id}",
        "eventSource": "aws:sqs",
        "body": json.dumps(payload),
        **payload,
    }


def _plain(trace: Trace, index: int, plan: CallPlan, outcome: Outcome) -> Callable[[], Any]:
    """A plain function passed as the callback by mistake: its side effect happens when
    it is called, and it returns a value, not an awaitable."""
    loop = asyncio.get_running_loop()
    store = trace.store

    def plain() -> Any:
        owner = store.claimed.get(index) if plan.key is not None else None
        run = Run(index, owner, loop.time(), ended=loop.time())
        trace.runs.append(run)
        outcome.runs.append(run)
        if plan.behaviour == "raise":
            run.error = CallbackFailed(f"call {index} failed")
            raise run.error
        run.returned = True
        run.value = _FALSY[index % len(_FALSY)] if plan.behaviour == "falsy" else {"call": index}
        return run.value

    return plain


def _callback(
    trace: Trace, index: int, plan: CallPlan, outcome: Outcome
) -> Callable[[Call | None], Awaitable[Any]]:
    loop = asyncio.get_running_loop()
    store = trace.store

    async def callback(call: Call | None) -> Any:
        owner = store.claimed.get(index) if plan.key is not None else None
        run = Run(index, owner, loop.time())
        trace.runs.append(run)
        outcome.runs.append(run)
        try:
            if call is not None and plan.behaviour in _HANDLED:
                value = await _behave_with_call(plan, index, run, loop, call)
            else:
                value = await _behave(plan, index, run, loop, trace.pauses)
        except asyncio.CancelledError as exc:
            if plan.behaviour == "cancel_self" and exc.args == ("own",):
                run.error = exc
            else:
                run.cancelled = True
            raise
        except BaseException as exc:
            run.error = exc
            raise
        else:
            run.returned = True
            run.value = value
            return value
        finally:
            run.ended = loop.time()

    return callback


_HANDLED = frozenset(
    {"complete_then_run", "complete_then_raise", "complete_without_response", "attach_later"}
)


async def _behave_with_call(
    plan: CallPlan, index: int, run: Run, loop: asyncio.AbstractEventLoop, call: Call
) -> Any:
    """``execute_call``: complete the record through the handle, then go on."""
    if plan.duration:
        await asyncio.sleep(plan.duration / 2)
    value = {"call": index}
    # The point of no return is the completion request, whatever its answer.
    run.answered = loop.time()
    run.returned = True
    run.value = value
    if plan.behaviour in ("complete_without_response", "attach_later"):
        await call.complete_without_response("simulated stream")
    else:
        await call.complete(value)
    if plan.duration:
        await asyncio.sleep(plan.duration / 2)
    if plan.behaviour == "complete_then_raise":
        raise CallbackFailed(f"call {index} failed after completing")
    if plan.behaviour == "attach_later":
        await call.complete(value)
    return value


async def _behave(
    plan: CallPlan,
    index: int,
    run: Run,
    loop: asyncio.AbstractEventLoop,
    pauses: list[tuple[float, float]],
) -> Any:
    behaviour = plan.behaviour
    if behaviour == "block":
        advance = getattr(loop, "advance", None)
        if advance is not None:
            run.blocked = True
            since = loop.time()
            advance(plan.duration)
            pauses.append((since, loop.time()))
        return {"call": index}
    if behaviour == "hang":
        await asyncio.sleep(1_000_000.0 * plan.duration + 1_000_000.0)
    if behaviour == "swallow":
        try:
            await asyncio.sleep(plan.duration)
        except asyncio.CancelledError:
            run.swallowed = True
            await asyncio.sleep(plan.duration or 0.001)
        return {"call": index}
    if plan.duration:
        await asyncio.sleep(plan.duration)
    if behaviour == "raise":
        raise CallbackFailed(f"call {index} failed")
    if behaviour == "base_exception":
        raise CallbackExit(f"call {index} exited")
    if behaviour == "cancel_self":
        raise asyncio.CancelledError("own")
    if behaviour == "unstorable":
        return Unstorable(index)
    if behaviour == "falsy":
        return _FALSY[index % len(_FALSY)]
    if behaviour == "wide_int":
        return {"call": index, "wide": 2**70 + index}
    if behaviour == "surrogate":
        # With a wide int beside it: an encoder's fallback for the int meets the surrogate.
        # (first: an encoder that falls back on the int then meets the surrogate).
        return {"call": index, "wide": -(2**70) - index, "text": "\ud800" + str(index)}
    if behaviour == "nan":
        return {"call": index, "value": math.nan}
    return {"call": index}


async def _probe(trace: Trace, start: float) -> None:
    """After the last call: wait past every lease, then ask the store about each key."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    for op in trace.store.ops:
        if op.name in ("claim", "extend"):
            # The lease counts from when the claim was sent (a store's own clock: from when
            # it applied the claim), whatever the sender's clock.
            for sent in (op.started, *(application.at for application in op.applications)):
                last = max(last, sent + op.arg.lease)
    await asyncio.sleep(max(0.0, last - loop.time()) + (0.05 if trace.own_clock else 0.01))
    ahead = 0.0
    if not trace.scenario.server_clock:
        # Ahead of every clock that ever wrote a lease (a clock that jumped back wrote
        # some while it was ahead).
        ahead = max(max(plan.skew, plan.skew + plan.jump) for plan in trace.scenario.managers)
    now = trace.base + loop.time() - start + ahead
    trace.probed_at = now
    for key in trace.keys.values():
        trace.probes[key] = await trace.store.inner.get(key, now=now)


def _library_tasks() -> list[str]:
    """Pending tasks running the library's own coroutines (none may outlive a call)."""
    found: list[str] = []
    tasks = asyncio.all_tasks()
    if len(tasks) == 1:
        return found  # only the scenario's own task
    for task in tasks:
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
