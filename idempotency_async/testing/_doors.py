"""How a simulated call enters the library — ``execute``, ``execute_call``, a decorated
function, an SQS batch (with a Lambda context or not) — and what its callback does: its
planned steps first (recovery points, ``step()``: each one's effect in the ledger), then
its planned behaviour."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from idempotency_async import Call
from idempotency_async.deadlines import deadline as ambient_deadline
from idempotency_async.decorators import idempotent_function
from idempotency_async.errors import ConfigError
from idempotency_async.integrations.aws_lambda import process_batch
from idempotency_async.manager import Manager
from idempotency_async.steps import step
from idempotency_async.testing._plans import CallPlan
from idempotency_async.testing._trace import (
    CallbackDeclined,
    CallbackExit,
    CallbackFailed,
    Outcome,
    Run,
    StepRun,
    Trace,
    Unstorable,
)

__all__ = [
    "Bounds",
    "Door",
    "LambdaContext",
    "behave",
    "bounds_of",
    "door",
    "handled_callback",
    "ledger_run",
    "message_key",
    "sqs_record",
    "step_names",
    "take_steps",
]

Door = Callable[["Bounds"], Awaitable[Any]]

_FALSY: tuple[Any, ...] = (0, "", [], False, None)


class LambdaContext:
    """The part of a Lambda context the library reads: the remaining time, in ms."""

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline

    def get_remaining_time_in_millis(self) -> int:
        left = self._deadline - asyncio.get_running_loop().time()
        return max(0, round(left * 1000))


class Bounds:
    """A call's deadline sources: ``timeout=`` and ``deadline=`` to pass, an ambient
    deadline to enter, a Lambda context (all optional; the earliest wins)."""

    def __init__(self) -> None:
        self.timeout: float | None = None
        self.deadline: float | None = None
        self.ambient: float | None = None
        self.context: LambdaContext | None = None

    def kwargs(self) -> dict[str, float]:
        given = {}
        if self.timeout is not None:
            given["timeout"] = self.timeout
        if self.deadline is not None:
            given["deadline"] = self.deadline
        return given

    @asynccontextmanager
    async def entered(self) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if self.ambient is not None:
                await stack.enter_async_context(ambient_deadline(self.ambient))
            yield


_ANSWER_KEPT = 0.25
_ANSWER_SHARE = 0.1


def bounds_of(plan: CallPlan, now: float) -> tuple[Bounds, float | None]:
    """The call's deadline sources, and its effective deadline (loop time; the earliest)."""
    bounds = Bounds()
    earliest: float | None = None
    for mode, seconds in ((plan.deadline, plan.timeout), *plan.also):
        if mode == "none":
            continue
        if plan.door in ("batch", "mcp", "route") and mode in ("timeout", "deadline"):
            # A batch, a tool call, a route take no timeout: the caller's deadline is ambient.
            mode = "ambient"
        # Two sources of one kind (a shrunk scenario may hold them): the earlier counts.
        if mode == "timeout":
            bounds.timeout = _earlier(bounds.timeout, seconds)
        elif mode == "deadline":
            bounds.deadline = _earlier(bounds.deadline, now + seconds)
        elif mode == "ambient":
            bounds.ambient = _earlier(bounds.ambient, seconds)
        elif mode == "lambda":
            bounds.context = LambdaContext(now + seconds)
            if plan.door == "batch" and not math.isnan(seconds):
                # A batch keeps time back to answer (docs/lambda.md, "Deadline"): its
                # records' deadline is min(0.25 s, 10 %) of the time left before Lambda's.
                seconds -= min(_ANSWER_KEPT, _ANSWER_SHARE * seconds)
        if not math.isnan(seconds):
            earliest = now + seconds if earliest is None else min(earliest, now + seconds)
    return bounds, earliest


def _earlier(current: float | None, seconds: float) -> float:
    if current is None or math.isnan(seconds):
        return seconds
    return min(current, seconds)


def door(trace: Trace, index: int, plan: CallPlan, outcome: Outcome, manager: Manager) -> Door:
    """How the call enters the library, with the callback in the plan's shape."""
    payload: dict[str, Any] = {"amount": plan.amount}
    if plan.key is not None:
        payload["id"] = plan.key
    if plan.door == "execute_call":
        handled = handled_callback(trace, index, plan, outcome)
        if plan.shape == "plain":
            plain = _plain(trace, index, plan, outcome)

            def with_plain_call(bounds: Bounds) -> Awaitable[Any]:
                return manager.execute_call(payload, lambda call: plain(), **bounds.kwargs())

            return with_plain_call
        if plan.shape == "lambda":

            def with_lambda_call(bounds: Bounds) -> Awaitable[Any]:
                return manager.execute_call(payload, lambda call: handled(call), **bounds.kwargs())

            return with_lambda_call

        def with_call(bounds: Bounds) -> Awaitable[Any]:
            return manager.execute_call(payload, handled, **bounds.kwargs())

        return with_call
    callback = handled_callback(trace, index, plan, outcome)
    if plan.door == "batch":
        batch_manager = (
            message_manager(trace, plan.manager, manager) if plan.by_message else manager
        )

        async def batch(bounds: Bounds) -> Any:
            records = [sqs_record(index, copy, plan, payload) for copy in range(plan.copies)]

            async def handler(record: dict[str, Any]) -> Any:
                return await callback(None)

            return await process_batch(
                batch_manager, {"Records": records}, handler, context=bounds.context
            )

        return batch
    if plan.door == "decorated":

        def decorated(bounds: Bounds) -> Awaitable[Any]:
            # The decorator takes a timeout: a deadline becomes one (the earlier wins).
            timeouts = [] if bounds.timeout is None else [bounds.timeout]
            if bounds.deadline is not None:
                timeouts.append(bounds.deadline - asyncio.get_running_loop().time())
            timeout = min(timeouts) if timeouts else None

            @idempotent_function(manager, payload="event", timeout=timeout)
            async def function(event: dict[str, Any]) -> Any:
                return await callback(None)

            return function(payload)

        return decorated
    if plan.shape == "plain":
        plain = _plain(trace, index, plan, outcome)

        def with_plain(bounds: Bounds) -> Awaitable[Any]:
            return manager.execute(payload, plain, **bounds.kwargs())

        return with_plain
    if plan.shape == "lambda":

        def with_lambda(bounds: Bounds) -> Awaitable[Any]:
            return manager.execute(payload, lambda: callback(None), **bounds.kwargs())

        return with_lambda

    def with_coroutine(bounds: Bounds) -> Awaitable[Any]:
        async def coroutine() -> Any:
            return await callback(None)

        return manager.execute(payload, coroutine, **bounds.kwargs())

    return with_coroutine


def sqs_record(index: int, copy: int, plan: CallPlan, payload: dict[str, Any]) -> dict[str, Any]:
    """An SQS record of call ``index`` carrying ``payload`` (also at its top level, where
    the scenario's ``event_key_jmespath`` finds it).  Keyed by message: one message per key
    and payload, its id the same on every delivery, its receipt handle new each time."""
    message_id = f"m{index}-{copy}"
    if plan.by_message:
        message_id = f"msg-k{plan.key}-a{plan.amount}"
    record = {
        "messageId": message_id,
        "receiptHandle": f"handle-{index}-{copy}",
        "eventSource": "aws:sqs",
        "body": json.dumps(payload),
        **payload,
    }
    if plan.fifo:
        record["eventSourceARN"] = "arn:aws:sqs:us-east-1:123456789012:orders.fifo"
        record["attributes"] = {"MessageGroupId": f"group-{plan.key}"}
    return record


def message_manager(trace: Trace, index: int, manager: Manager) -> Manager:
    """The process's manager as a batch keyed by message id takes it: no key selection
    (``process_batch`` keys each record by its ``messageId``)."""
    found = trace.message_managers.get(index)
    if found is None:
        options = dataclasses.replace(manager.options, event_key_jmespath=None)
        found = trace.message_managers[index] = Manager(manager.store, options)
    return found


def message_key(trace: Trace, index: int, manager: Manager, plan: CallPlan) -> str | None:
    """The store key of a batch keyed by message: the message id, hashed under the
    process's prefix (as ``process_batch`` keys it)."""
    options = dataclasses.replace(
        manager.options, event_key_jmespath="messageId", key_prefix=manager.key_prefix
    )
    record = sqs_record(index, 0, plan, {"amount": plan.amount})
    return Manager(manager.store, options).key_for(record)


def owner_of_task(trace: Trace, plan: CallPlan) -> str | None:
    """The owner token of the claim the running task holds (its callback runs under it)."""
    if plan.key is None:
        return None
    task = asyncio.current_task()
    return None if task is None else trace.store.holding.get(task)


def _plain(trace: Trace, index: int, plan: CallPlan, outcome: Outcome) -> Callable[[], Any]:
    """A plain function passed as the callback by mistake: its side effect happens when
    it is called, and it returns a value, not an awaitable."""
    loop = asyncio.get_running_loop()

    def plain() -> Any:
        run = Run(index, owner_of_task(trace, plan), loop.time(), ended=loop.time())
        trace.runs.append(run)
        outcome.runs.append(run)
        if plan.behaviour == "raise":
            run.error = CallbackFailed(f"call {index} failed")
            raise run.error
        run.returned = True
        run.value = _FALSY[index % len(_FALSY)] if plan.behaviour == "falsy" else {"call": index}
        return run.value

    return plain


def handled_callback(
    trace: Trace, index: int, plan: CallPlan, outcome: Outcome
) -> Callable[[Call | None], Awaitable[Any]]:
    """The simulated callback: its run goes into the ledger, then it behaves as planned."""
    loop = asyncio.get_running_loop()

    async def callback(call: Call | None) -> Any:
        with ledger_run(trace, index, plan, outcome, loop) as run:
            await take_steps(trace, index, plan, run, loop)
            if call is not None and plan.behaviour in _HANDLED:
                value = await _behave_with_call(plan, index, run, loop, call)
            else:
                value = await behave(plan, index, run, loop, trace.pauses)
            run.returned = True
            run.value = value
            return value

    return callback


@contextlib.contextmanager
def ledger_run(
    trace: Trace, index: int, plan: CallPlan, outcome: Outcome, loop: asyncio.AbstractEventLoop
) -> Iterator[Run]:
    """One run of a simulated callback or endpoint, in the ledger: how it ended (its own
    error, a cancellation from outside, or a return the body records) and when."""
    run = Run(index, owner_of_task(trace, plan), loop.time())
    trace.runs.append(run)
    outcome.runs.append(run)
    try:
        yield run
    except asyncio.CancelledError as exc:
        if plan.behaviour == "cancel_self" and exc.args == ("own",):
            run.error = exc  # its own, not its caller's
        else:
            run.cancelled = True
        raise
    except BaseException as exc:
        run.error = exc
        raise
    finally:
        run.ended = loop.time()


def step_names(plan: CallPlan, index: int) -> list[str]:
    """The names of the steps call ``index`` takes: ``s0``, ``s1``... as every call of its
    key takes them — but a ``mismatch`` call's at ``step_at``, which is its own."""
    names = [f"s{position}" for position in range(plan.steps)]
    if plan.step_fault == "mismatch" and plan.step_at < plan.steps:
        names[plan.step_at] = f"s{plan.step_at}-c{index}"
    return names


async def take_steps(
    trace: Trace, index: int, plan: CallPlan, run: Run, loop: asyncio.AbstractEventLoop
) -> None:
    """The callback's planned steps, each through ``step()``: its function's effect goes
    into the ledger (``trace.steps``), and it fails at ``step_at`` as planned.  A store
    that does not record steps: none are taken."""
    if not plan.steps or not trace.records_steps:
        return
    key = trace.call_keys.get(index)
    pause = plan.duration / (2 * plan.steps) if plan.duration else 0.0
    for position, name in enumerate(step_names(plan, index)):
        taken = StepRun(index, run.owner, key, name, position, loop.time())
        run.steps.append(taken)
        trace.steps.append(taken)
        fault = plan.step_fault if position == plan.step_at else "none"
        try:
            taken.value = await step(name, _step_function(taken, fault, pause))
        except BaseException as exc:
            taken.error = exc
            raise
        finally:
            taken.ended = loop.time()
        if fault == "raise_after":
            raise CallbackFailed(f"call {index} failed after step {name}")


def _step_function(taken: StepRun, fault: str, pause: float) -> Callable[[], Awaitable[Any]]:
    async def work() -> Any:
        taken.ran = True
        if pause:
            await asyncio.sleep(pause)
        if fault == "raise_in":
            raise CallbackFailed(f"call {taken.call}: step {taken.name} failed")
        taken.effect = True  # the step's effect: from here on it happened
        if fault == "crash_in":
            raise CallbackExit(f"call {taken.call} crashed in step {taken.name}")
        result: Any = {"step": taken.name, "by": taken.call}
        if fault == "not_stored":
            result = Unstorable(taken.call)
        taken.result = result
        taken.returned = asyncio.get_running_loop().time()
        return result

    return work


_HANDLED = frozenset(
    {
        "complete_then_run",
        "complete_then_raise",
        "complete_without_response",
        "attach_later",
        "complete_odd",
        "complete_twice",
        "without_response_then_raise",
        "complete_when_cut_off",
    }
)


async def _behave_with_call(
    plan: CallPlan, index: int, run: Run, loop: asyncio.AbstractEventLoop, call: Call
) -> Any:
    """``execute_call``: complete the record through the handle, then go on."""
    if plan.behaviour == "complete_when_cut_off":
        # Works until it is cut off, then records what it has in its cleanup and lets the
        # cancellation go on: past its cutoff, the completion must be refused.
        try:
            await asyncio.sleep(1_000_000.0 * plan.duration + 1_000_000.0)
        except asyncio.CancelledError:
            await call.complete({"call": index, "partial": True})
            raise
    if plan.duration:
        await asyncio.sleep(plan.duration / 2)
    value: Any = {"call": index}
    if plan.behaviour == "complete_odd":
        value = _odd(index)
    # The point of no return is the completion request, whatever its answer.
    run.answered = loop.time()
    run.returned = True
    run.value = value
    if plan.behaviour in (
        "complete_without_response",
        "attach_later",
        "without_response_then_raise",
    ):
        await call.complete_without_response("simulated stream")
    else:
        await call.complete(value)
    if plan.duration:
        await asyncio.sleep(plan.duration / 2)
    if plan.behaviour in ("complete_then_raise", "without_response_then_raise"):
        raise CallbackFailed(f"call {index} failed after completing")
    if plan.behaviour == "attach_later":
        await call.complete(value)
    if plan.behaviour == "complete_twice":
        # A second answer: refused (one key, one answer); the callback goes on.
        with contextlib.suppress(ConfigError):
            await call.complete({"call": index, "again": True})
    return value


def _odd(index: int) -> Any:
    """A result a store or the JSON encoder may not take as it is."""
    return (_FALSY[index % len(_FALSY)], Unstorable(index), {"wide": 2**70 + index})[index % 3]


async def behave(
    plan: CallPlan,
    index: int,
    run: Run,
    loop: asyncio.AbstractEventLoop,
    pauses: list[tuple[float, float]],
) -> Any:
    """What a callback (or an endpoint, up to its response) does, as planned."""
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
    if behaviour == "declared":
        raise CallbackDeclined(f"call {index} declined")
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
        return {"call": index, "wide": -(2**70) - index, "text": "\ud800" + str(index)}
    if behaviour == "nan":
        return {"call": index, "value": math.nan}
    return {"call": index}
