"""Running one kit scenario: the user's handler on a logging, fault-injecting store.

The store the handler gets is the simulator's :class:`FaultyStore` (the scenario's faults,
and what the store held before and after each request), behind a sampler that reads the
user's effect counter at every store request and at each call's start and end — so the
oracle (``_kit_oracle``) can tell an effect made before a claim from one made while a run
held the key.  On virtual time (the default, with a ``MemoryStore``) the store judges
leases by the loop's clock, so a retry after a lease of an hour costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from idempotency_async.record import Claim, Completion, Record, Status
from idempotency_async.stores.base import (
    Extended,
    Found,
    RecordsSteps,
    Stepped,
    StepWrite,
    Store,
    Verdict,
    Written,
)
from idempotency_async.testing._faults import CALL, FaultyStore, ServerClockStore
from idempotency_async.testing._kit_scenario import Call, Scenario
from idempotency_async.testing._kit_steps import STEPS, Steps, child_tasks, stepping
from idempotency_async.testing._kit_targets import Sender, Target

__all__ = ["Mark", "Outcome", "Trace", "run_scenario", "step_names"]

Effects = Callable[[], int]
_request_keys = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Mark:
    """One reading of the effect counter, and what was happening."""

    call: int | None
    what: str
    """``start``, ``end``, ``<op> sent``, ``claimed``, ``refused``, ``<op> done``,
    ``<op> failed``, ``settled``."""
    count: int
    owner: str | None = None
    at: float = 0.0
    steps: int = 0
    """Awaits the call had made by then."""
    detail: Any = None
    """``claimed``: the names of the recorded steps the claim resumed (a tuple);
    ``record_step sent``: the step's position (0-based) and the names written (a tuple);
    ``record_step done``: whether the recovery point was recorded."""


@dataclass(slots=True)
class Outcome:
    """How one call ended for its caller."""

    answer: Any = None
    error: BaseException | None = None
    crashed: bool = False
    """The kit cancelled it (at ``Call.cancel_at``)."""
    steps: int = 0
    """Awaits it made."""


@dataclass(slots=True)
class Trace:
    scenario: Scenario
    marks: list[Mark] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    store: FaultyStore | None = None
    store_keys: set[str] = field(default_factory=set)
    error: BaseException | None = None
    logs: list[str] = field(default_factory=list)
    """What the library logged (warnings and errors) while the scenario ran."""
    logged_errors: list[BaseException] = field(default_factory=list)
    """The exceptions those log lines carried (a batch item's, a route's)."""
    downstream: bool = False
    """The effects counted are a provider's, deduplicated by the key the handler sends it
    (``downstream_key``): one effect per key, whatever crashed."""
    transactions: bool = False
    """The store offers transactional calls (``execute_in_transaction``): their claims and
    completions go through the caller's transaction, not through the kit's wrapper."""

    @property
    def transactional(self) -> bool:
        """No call claimed through the store itself: every run was a transactional call."""
        return self.transactions and not any(m.what == "claim sent" for m in self.marks)

    """The run itself failed (a deadlock: the handler waits for something nothing brings;
    the effect counter raised)."""


class _Sampling:
    """A store wrapper marking the effect counter around every request."""

    record_step: Callable[[StepWrite], Awaitable[Stepped]]

    def __init__(self, inner: Store, trace: Trace, effects: Effects, clock: Callable[[], float]):
        self.inner = inner
        self.max_response_bytes = inner.max_response_bytes
        self.trace = trace
        self.effects = effects
        self.clock = clock
        self.crashed: set[int] = set()
        """Calls the kit crashed at a recovery point (``Call.crash_before_step``...)."""
        if isinstance(inner, RecordsSteps):
            self.record_step = self._record_step

    def mark(self, what: str, owner: str | None = None, detail: Any = None) -> None:
        steps = STEPS.get()
        count = 0 if steps is None else steps.count
        mark = Mark(CALL.get(), what, self.read(), owner, self.clock(), count, detail)
        self.trace.marks.append(mark)

    def read(self) -> int:
        """The counter; a counter that fails is reported, never raised into a request."""
        try:
            return int(self.effects())
        except Exception as exc:
            if self.trace.error is None:
                self.trace.error = exc
            return self.trace.marks[-1].count if self.trace.marks else 0

    async def _op(
        self,
        name: str,
        key: str,
        owner: str | None,
        request: Callable[[], Awaitable[Any]],
        detail: Any = None,
    ) -> Any:
        self.trace.store_keys.add(key)
        self.mark(f"{name} sent", owner, detail)
        try:
            # A request is two awaits, as on a network: on its way (cancelled there, it
            # never lands) and on its way back (cancelled there, it applied unanswered).
            await asyncio.sleep(0)
            answer = await request()
            await asyncio.sleep(0)
        except BaseException:
            self.mark(f"{name} failed", owner)
            raise
        if name == "claim":
            claimed = isinstance(answer, Verdict) and answer.found is Found.CLAIMED
            resumed = step_names(answer.record.steps) if claimed and answer.record else ()
            self.mark("claimed" if claimed else "refused", owner, resumed)
        elif name == "record_step":
            self.mark("record_step done", owner, answer is Stepped.RECORDED)
        else:
            self.mark(f"{name} done", owner)
        return answer

    async def _record_step(self, write: StepWrite) -> Stepped:
        """A step's recovery point; the scenario's call may crash just before it is sent
        (``Call.crash_before_step``: the step's effect made, nothing written) or just after
        it was written (``Call.crash_after_step``)."""
        inner: Any = self.inner
        index = CALL.get()
        steps = STEPS.get()
        call = None if index is None else self.trace.scenario.calls[index]
        number = write.position + 1
        crash = (
            call is not None
            and steps is not None
            and index not in self.crashed
            and number in (call.crash_before_step, call.crash_after_step)
        )
        if crash and call is not None and call.crash_before_step == number:
            assert index is not None and steps is not None
            self.crashed.add(index)
            self.trace.store_keys.add(write.key)
            self.mark("record_step sent", write.owner, (write.position, step_names(write.steps)))
            _crash(steps)
            self.mark("record_step failed", write.owner)
            raise asyncio.CancelledError  # never sent: the process is gone
        detail = (write.position, step_names(write.steps))
        answer: Stepped = await self._op(
            "record_step", write.key, write.owner, lambda: inner.record_step(write), detail
        )
        if crash:
            assert index is not None and steps is not None
            self.crashed.add(index)
            _crash(steps)  # written; the process dies before it hears the answer
        return answer

    async def claim(self, claim: Claim) -> Verdict:
        answer: Verdict = await self._op(
            "claim", claim.key, claim.owner, lambda: self.inner.claim(claim)
        )
        return answer

    async def get(self, key: str, *, now: float) -> Verdict:
        answer: Verdict = await self._op("get", key, None, lambda: self.inner.get(key, now=now))
        return answer

    async def complete(self, completion: Completion) -> Written:
        request = lambda: self.inner.complete(completion)  # noqa: E731
        answer: Written = await self._op("complete", completion.key, completion.owner, request)
        return answer

    async def release(self, key: str, owner: str) -> bool:
        answer: bool = await self._op("release", key, owner, lambda: self.inner.release(key, owner))
        return answer

    async def extend(self, claim: Claim) -> Extended:
        answer: Extended = await self._op(
            "extend", claim.key, claim.owner, lambda: self.inner.extend(claim)
        )
        return answer

    async def force_release(self, key: str) -> Record | None:
        return await self.inner.force_release(key)

    async def aclose(self) -> None:
        await self.inner.aclose()


def step_names(text: str | None) -> tuple[str, ...]:
    """The names in a record's step list (``Record.steps``, ``StepWrite.steps``)."""
    if not text:
        return ()
    try:
        entries = json.loads(text)
        return tuple(str(entry[0]) for entry in entries)
    except (ValueError, TypeError, IndexError, KeyError):
        return ()


def _crash(steps: Steps) -> None:
    """Cancel the call's own task, as the kit's crash at an await does."""
    if steps.task is not None and not steps.cancelled:
        steps.task.cancel()
        steps.cancelled = True
        steps.on_cancel()


class _StepEvents(logging.Handler):
    """Marks the counter at each ``step_replayed`` event (logged at DEBUG by the library,
    in the task of the call that replayed the step): the effects a resumed call makes
    while its recorded steps are replayed are code outside the steps, running again."""

    def __init__(self, sampling: _Sampling) -> None:
        super().__init__(logging.DEBUG)
        self.sampling = sampling

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "idempotency_event", None) == "step_replayed":
            self.sampling.mark("step_replayed")


@contextlib.contextmanager
def _step_events(sampling: _Sampling, wanted: bool) -> Any:
    if not wanted:
        yield
        return
    logger = logging.getLogger("idempotency_async")
    handler = _StepEvents(sampling)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def run_scenario(
    target: Target,
    scenario: Scenario,
    effects: Effects,
    make_store: Callable[[], Store],
    *,
    virtual: bool,
    settle: float = 1.0,
    step_events: bool = False,
) -> Trace:
    """Run ``scenario`` on the running loop; ``virtual``: the loop's clock is virtual and the
    store judges by it; ``step_events``: mark the counter at each replayed step."""
    loop = asyncio.get_running_loop()
    trace = Trace(scenario)
    base = time.time() - loop.time()
    clock: Callable[[], float] = lambda: base + loop.time()  # noqa: E731
    faulty = FaultyStore(make_store(), {i: c.faults for i, c in enumerate(scenario.calls)})
    trace.store = faulty
    sampling = _Sampling(faulty, trace, effects, clock)
    bind = getattr(faulty.inner, "transaction_store", None)
    if bind is not None:
        # Transactional calls write in the caller's transaction (no faults, no marks).
        trace.transactions = True
        sampling.transaction_store = bind  # type: ignore[attr-defined]
    front: Store = ServerClockStore(sampling, clock) if virtual else sampling
    processes = max(call.process for call in scenario.calls) + 1
    senders = [target.build(front) for _ in range(processes)]
    request_key = f"kit-{next(_request_keys)}"
    if not virtual:
        await _forget(target, senders[0], scenario, request_key, faulty)
    before = asyncio.all_tasks()
    trace.marks.append(Mark(None, "begin", sampling.read(), None, clock()))
    counted = (
        child_tasks(loop) if getattr(target, "child_tasks", False) else contextlib.nullcontext()
    )
    with counted, _step_events(sampling, step_events):
        await _calls(scenario, senders, request_key, trace, faulty, sampling, clock, settle)
    trace.marks.append(Mark(None, "settled", sampling.read(), None, clock()))
    for task in asyncio.all_tasks() - before - {asyncio.current_task()}:
        task.cancel()
    await faulty.aclose()
    return trace


async def _calls(
    scenario: Scenario,
    senders: list[Sender],
    request_key: str,
    trace: Trace,
    faulty: FaultyStore,
    sampling: _Sampling,
    clock: Callable[[], float],
    settle: float,
) -> None:
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []
    for index, call in enumerate(scenario.calls):
        await _wait_for_start(call, tasks, faulty, trace, clock)
        outcome = Outcome()
        trace.outcomes.append(outcome)
        payload = scenario.variant if call.variant else scenario.payload
        context = contextvars.copy_context()
        context.run(CALL.set, index)
        coro = _one(senders[call.process], payload, request_key, call, outcome, sampling)
        tasks.append(loop.create_task(coro, context=context))
        await asyncio.sleep(0)  # the call starts before the next one is considered
    await asyncio.wait(tasks)
    await asyncio.sleep(settle)  # late answers land, tasks the handler left behind run
    for late in faulty.late:
        if not late.done():
            await asyncio.wait([late])


async def _forget(
    target: Target, sender: Sender, scenario: Scenario, request_key: str, store: Store
) -> None:
    """A store that outlives scenarios (the user's): no record of an earlier one may answer."""
    for payload in (scenario.payload, scenario.variant):
        key = target.key_of(sender, payload, request_key)
        if key is not None:
            await store.force_release(key)


async def _wait_for_start(
    call: Call,
    tasks: list[asyncio.Task[None]],
    store: FaultyStore,
    trace: Trace,
    clock: Callable[[], float],
) -> None:
    if not tasks or call.start == "with_previous":
        return
    if call.start == "after_previous":
        await asyncio.wait(tasks[-1:])
        return
    await asyncio.wait(tasks)
    lease_end = 0.0
    for key in trace.store_keys:
        record = (await store.inner.get(key, now=0.0)).record
        if record is not None and record.status is Status.INPROGRESS and record.lease_end:
            lease_end = max(lease_end, record.lease_end)
    if lease_end > clock():
        # Past the lease (whole milliseconds, as the stores count them).
        await asyncio.sleep(lease_end - clock() + 0.002)


async def _one(
    sender: Sender, payload: Any, request_key: str, call: Call, outcome: Outcome, marks: _Sampling
) -> None:
    steps = Steps(call.cancel_at, lambda: marks.mark("cancelled"))
    STEPS.set(steps)
    marks.mark("start")
    task = asyncio.current_task()
    assert task is not None
    steps.task = task
    try:
        outcome.answer = await stepping(sender(payload, request_key), steps)
    except asyncio.CancelledError as exc:
        if not steps.cancelled:
            raise
        outcome.crashed = True
        outcome.error = exc
        task.uncancel()
    except BaseException as exc:  # the caller's outcome, whatever it is
        outcome.error = exc
    finally:
        outcome.steps = steps.count
        marks.mark("end")
