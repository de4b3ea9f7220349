"""A store wrapper that injects a scenario's faults and logs what the store saw and did.

Every operation is logged with the call that sent it, and with the record of its key
read just before and just after it was applied (under a lock, so the log is the store's
own history): the oracle judges the manager against the record as the store held it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from idempotency_async.errors import (
    InconsistentStateError,
    PersistenceError,
    StoreAccessDeniedError,
    StoreThrottledError,
    StoreUnavailableError,
    StoreValidationError,
)
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores.base import (
    Extended,
    Found,
    RecordsSteps,
    Stepped,
    StepWrite,
    Store,
    Verdict,
    Wakes,
    Watch,
    Written,
)
from idempotency_async.testing._plans import Fault

__all__ = ["CALL", "Application", "FaultyStore", "Op", "ServerClockStore"]

_ERRORS: dict[str, type[Exception]] = {
    "unavailable": StoreUnavailableError,
    "throttled": StoreThrottledError,
    "denied": StoreAccessDeniedError,
    "validation": StoreValidationError,
    "inconsistent": InconsistentStateError,
}

CALL: contextvars.ContextVar[int | None] = contextvars.ContextVar("simulated_call", default=None)
"""The index of the scenario call the current task runs."""

_NONSENSE: dict[str, object] = {
    "claim": "OK",
    "get": "OK",
    "complete": "OK",
    "release": "yes",
    "extend": "OK",
    "force_release": "yes",
    "record_step": "OK",
}


@dataclass(slots=True)
class Application:
    """One time the operation reached the store (twice when it was sent again)."""

    order: int
    at: float
    before: Record | None
    after: Record | None = None
    answer: Any = None
    error: BaseException | None = None
    done: bool = False
    """False when the operation was interrupted and its effect is unknown."""
    until: float | None = None
    """When the store's answer came back (loop time): a store judging by its own clock
    judged it somewhere between ``at`` and this."""


@dataclass(slots=True)
class Op:
    seq: int
    call: int | None
    task: asyncio.Task[Any] | None
    name: str
    key: str
    arg: Any
    """The claim, the completion, the owner (release), the judging time (get) or the step
    write (record_step)."""
    started: float
    fault: Fault | None = None
    ended: float | None = None
    delivered: Any = None
    """What the manager got back (when it got an answer)."""
    raised: BaseException | None = None
    applications: list[Application] = field(default_factory=list)


class FaultyStore:
    """Wraps a real store: logs every operation and injects the faults of each call.

    A store that wakes waiters (:class:`Wakes`) keeps doing so through the wrapper: its
    wake-ups are hints the waiter checks with a read, which is logged and faulted.  A store
    that records steps (:class:`RecordsSteps`) does so through the wrapper too, each
    ``record_step`` logged and faulted as the other operations are; one that does not
    leaves the wrapper without the capability (the managers then refuse steps)."""

    watch: Callable[[str], AbstractContextManager[Watch]]
    record_step: Callable[[StepWrite], Awaitable[Stepped]]

    def __init__(
        self,
        inner: Store,
        faults: dict[int, tuple[Fault, ...]],
        latency: dict[int, float] | None = None,
    ) -> None:
        self.inner = inner
        self.max_response_bytes = inner.max_response_bytes
        if isinstance(inner, Wakes):
            self.watch = inner.watch
        if isinstance(inner, RecordsSteps):
            self.record_step = self._record_step
        self.ops: list[Op] = []
        self.claimed: dict[int, str] = {}
        """The owner of each call's last claim that the manager was told succeeded."""
        self.holding: dict[asyncio.Task[Any], str] = {}
        """The owner of the last claim each task was told succeeded: a callback runs in the
        task that claimed (a batch's records each in their own)."""
        self._faults = faults
        self._latency = latency or {}
        self._sent: dict[tuple[int | None, str], int] = {}
        self._lock = asyncio.Lock()
        self.applied = 0
        """How many times an operation reached the store so far."""
        self._loop = asyncio.get_running_loop()
        self.late: list[asyncio.Task[Any]] = []
        """Resends still on their way (the scenario awaits them before its probe)."""

    def _fault_for(self, call: int | None, name: str) -> Fault | None:
        count = self._sent.get((call, name), 0)
        self._sent[(call, name)] = count + 1
        if call is None:
            return None
        for fault in self._faults.get(call, ()):
            if fault.op == name and fault.nth == count:
                return fault
        return None

    async def _run(self, name: str, key: str, arg: Any, apply: Callable[[], Awaitable[Any]]) -> Any:
        call = CALL.get()
        op = Op(len(self.ops), call, asyncio.current_task(), name, key, arg, self._loop.time())
        op.fault = self._fault_for(call, name)
        self.ops.append(op)
        fault = op.fault
        latency = 0.0 if call is None else self._latency.get(call, 0.0)
        try:
            if fault is not None and fault.kind == "error":
                raise _error(fault, f"{name}: the store failed (injected)")
            if fault is not None and fault.kind == "late":
                # The request is lost on the way; a resend lands later, after other
                # operations (the caller is told the answer was lost).
                self.late.append(asyncio.create_task(self._land_late(op, apply, fault.seconds)))
                raise _error(fault, f"{name}: no answer (injected; it lands later)")
            if latency:
                await asyncio.sleep(latency)  # a slow store: every request of the call
            if fault is not None and fault.kind in ("delay", "stall"):
                await asyncio.sleep(fault.seconds)
            if fault is not None and fault.kind == "adrift":
                # On its way: it lands after ``seconds`` whether or not its sender still
                # waits for it (a request cannot be unsent).
                landing = asyncio.create_task(self._land_adrift(op, apply, fault.seconds))
                self.late.append(landing)
                answer = await asyncio.shield(landing)
            else:
                answer = await self._apply(op, apply)
            if fault is not None and fault.kind == "resend":
                answer = await self._apply(op, apply)
            elif fault is not None and fault.kind == "lose":
                raise _error(fault, f"{name}: the answer was lost (injected)")
            elif fault is not None and fault.kind == "nonsense":
                answer = _NONSENSE[name]
            elif fault is not None and fault.kind == "slow_answer":
                await asyncio.sleep(fault.seconds)  # applied; the answer takes its time
            op.delivered = answer
            if (
                name == "claim"
                and call is not None
                and isinstance(answer, Verdict)
                and answer.found is Found.CLAIMED
            ):
                self.claimed[call] = arg.owner
                if op.task is not None:
                    self.holding[op.task] = arg.owner
            return answer
        except BaseException as exc:
            op.raised = exc
            raise
        finally:
            op.ended = self._loop.time()

    async def _land_late(self, op: Op, apply: Callable[[], Awaitable[Any]], seconds: float) -> None:
        await asyncio.sleep(seconds)
        with contextlib.suppress(Exception):
            await self._apply(op, apply)

    async def _land_adrift(
        self, op: Op, apply: Callable[[], Awaitable[Any]], seconds: float
    ) -> Any:
        await asyncio.sleep(seconds)
        return await self._apply(op, apply)

    async def _apply(self, op: Op, apply: Callable[[], Awaitable[Any]]) -> Any:
        async with self._lock:
            application = Application(self.applied, self._loop.time(), await self._peek(op.key))
            self.applied += 1
            op.applications.append(application)
            try:
                application.answer = await apply()
            except asyncio.CancelledError:
                raise  # interrupted: its effect is unknown
            except Exception as exc:
                application.error = exc
                application.after = await self._peek(op.key)
                application.done = True
                application.until = self._loop.time()
                raise
            application.after = await self._peek(op.key)
            application.done = True
            application.until = self._loop.time()
            return application.answer

    async def _peek(self, key: str) -> Record | None:
        return (await self.inner.get(key, now=0.0)).record

    async def claim(self, claim: Claim) -> Verdict:
        result: Verdict = await self._run(
            "claim", claim.key, claim, lambda: self.inner.claim(claim)
        )
        return result

    async def get(self, key: str, *, now: float) -> Verdict:
        result: Verdict = await self._run("get", key, now, lambda: self.inner.get(key, now=now))
        return result

    async def complete(self, completion: Completion) -> Written:
        result: Written = await self._run(
            "complete", completion.key, completion, lambda: self.inner.complete(completion)
        )
        return result

    async def release(self, key: str, owner: str) -> bool:
        result: bool = await self._run(
            "release", key, owner, lambda: self.inner.release(key, owner)
        )
        return result

    async def extend(self, claim: Claim) -> Extended:
        result: Extended = await self._run(
            "extend", claim.key, claim, lambda: self.inner.extend(claim)
        )
        return result

    async def force_release(self, key: str) -> Record | None:
        result: Record | None = await self._run(
            "force_release", key, None, lambda: self.inner.force_release(key)
        )
        return result

    async def _record_step(self, write: StepWrite) -> Stepped:
        inner: Any = self.inner
        result: Stepped = await self._run(
            "record_step", write.key, write, lambda: inner.record_step(write)
        )
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()


def _error(fault: Fault, message: str) -> PersistenceError | InconsistentStateError:
    error = _ERRORS.get(fault.error, StoreUnavailableError)(message)
    assert isinstance(error, PersistenceError | InconsistentStateError)
    return error


class ServerClockStore:
    """A store judging by a clock of its own (as Redis ``TIME`` does): every ``now`` the
    managers send is replaced by ``clock()``, so their skew no longer moves leases."""

    watch: Callable[[str], AbstractContextManager[Watch]]
    record_step: Callable[[StepWrite], Awaitable[Stepped]]

    def __init__(self, inner: Store, clock: Callable[[], float]) -> None:
        self.inner = inner
        self.clock = clock
        self.max_response_bytes = inner.max_response_bytes
        if isinstance(inner, Wakes):
            self.watch = inner.watch
        if isinstance(inner, RecordsSteps):
            self.record_step = self._record_step

    async def claim(self, claim: Claim) -> Verdict:
        return await self.inner.claim(claim._replace(now=self.clock()))

    async def get(self, key: str, *, now: float) -> Verdict:
        return await self.inner.get(key, now=self.clock())

    async def complete(self, completion: Completion) -> Written:
        return await self.inner.complete(completion._replace(now=self.clock()))

    async def release(self, key: str, owner: str) -> bool:
        return await self.inner.release(key, owner)

    async def extend(self, claim: Claim) -> Extended:
        return await self.inner.extend(claim._replace(now=self.clock()))

    async def force_release(self, key: str) -> Record | None:
        return await self.inner.force_release(key)

    async def _record_step(self, write: StepWrite) -> Stepped:
        inner: Any = self.inner
        result: Stepped = await inner.record_step(write._replace(now=self.clock()))
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()
