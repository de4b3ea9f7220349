"""Test helpers: a store wrapper that records calls and injects faults, and a movable clock."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from idempotency_async import MemoryStore
from idempotency_async.errors import StoreUnavailableError
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores.base import Extended, Store, Verdict, Written

T = TypeVar("T")


@dataclass
class Clock:
    """A wall clock the test moves by hand (Options(clock=...))."""

    now: float = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class RecordingStore:
    """Wraps a real store: records each call, and injects faults into chosen operations.

    ``fail_on``: raise before the operation applies.  ``delay``: sleep before it.
    ``lose_answer``: apply it, then raise ``StoreUnavailableError`` (the answer was lost).
    ``resend``: apply it, lose the answer, and send it again as an SDK retry would,
    returning the second answer.
    """

    inner: Store
    calls: list[str] = field(default_factory=list)
    fail_on: dict[str, BaseException] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)
    lose_answer: set[str] = field(default_factory=set)
    resend: set[str] = field(default_factory=set)
    claims: list[Claim] = field(default_factory=list)

    @property
    def max_response_bytes(self) -> int:
        return self.inner.max_response_bytes

    async def _call(self, name: str, operation: Callable[[], Awaitable[T]]) -> T:
        self.calls.append(name)
        error = self.fail_on.get(name)
        if error is not None:
            raise error
        if name in self.delay:
            await asyncio.sleep(self.delay[name])
        answer = await operation()
        if name in self.resend:
            return await operation()
        if name in self.lose_answer:
            raise StoreUnavailableError(f"{name}: the answer was lost (injected)")
        return answer

    async def claim(self, claim: Claim) -> Verdict:
        self.claims.append(claim)
        return await self._call("claim", lambda: self.inner.claim(claim))

    async def get(self, key: str, *, now: float) -> Verdict:
        return await self._call("get", lambda: self.inner.get(key, now=now))

    async def complete(self, completion: Completion) -> Written:
        return await self._call("complete", lambda: self.inner.complete(completion))

    async def release(self, key: str, owner: str) -> bool:
        return await self._call("release", lambda: self.inner.release(key, owner))

    async def extend(self, claim: Claim) -> Extended:
        return await self._call("extend", lambda: self.inner.extend(claim))

    async def force_release(self, key: str) -> Record | None:
        return await self._call("force_release", lambda: self.inner.force_release(key))

    async def aclose(self) -> None:
        await self.inner.aclose()


async def record_of(store: Store, key: str | None, now: float = 1_700_000_000.0) -> Record | None:
    """The record of ``key`` as the store holds it (judged at ``now``; any state)."""
    assert key is not None
    return (await store.get(key, now=now)).record


async def run(value: Any) -> Any:
    return value


async def start_holding(
    manager: Any,
    payload: Any,
    *,
    seconds: float = 0.0,
    until: asyncio.Event | None = None,
    result: Any = None,
    error: BaseException | None = None,
    timeout: float = 5.0,
) -> asyncio.Task[Any]:
    """Start ``manager.execute(payload, ...)`` whose callback holds the key for ``seconds``
    (or until ``until`` is set) and then returns ``result`` (or raises ``error``); return
    once the callback is running.

    Prefer ``until`` when the test must act while the key is held: a fixed hold races the
    test's own store round trips, which a slow machine can stretch past it."""
    started = asyncio.Event()

    async def hold() -> Any:
        started.set()
        if until is not None:
            await until.wait()
        else:
            await asyncio.sleep(seconds)
        if error is not None:
            raise error
        return result

    task = asyncio.create_task(manager.execute(payload, hold, timeout=timeout))
    running = asyncio.create_task(started.wait())
    await asyncio.wait({task, running}, return_when=asyncio.FIRST_COMPLETED)
    running.cancel()
    if not started.is_set():  # the call ended without running the callback: say why
        task.result()
        raise AssertionError("the holding call returned without running its callback")
    return task


def checkout_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that imports this checkout of the library
    (not whatever an editable install elsewhere points at)."""
    root = str(Path(__file__).parents[1])
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": root if not path else os.pathsep.join((root, path)),
        **extra,
    }


def on_stores(*names: str) -> pytest.MarkDecorator:
    """Run a test on these of the conftest's six stores only.

    For the sleep-bound scenarios of the lifecycle, whose timing no store changes beyond
    its round trips: the whole CI run must stay within its time budget, and each store's
    own behaviour is covered by the contract kit and the rest of its suite.
    """
    return pytest.mark.parametrize("store", names, indirect=True)


class MemoryWrapper:
    """A MemoryStore behind the store protocol, every operation passed on: for a subclass
    to make unsafe (the conformance kit's broken stores, hostile answers)."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.max_response_bytes = self.inner.max_response_bytes

    async def claim(self, claim: Claim) -> Verdict:
        return await self.inner.claim(claim)

    async def get(self, key: str, *, now: float) -> Verdict:
        return await self.inner.get(key, now=now)

    async def complete(self, completion: Completion) -> Written:
        return await self.inner.complete(completion)

    async def release(self, key: str, owner: str) -> bool:
        return await self.inner.release(key, owner)

    async def extend(self, claim: Claim) -> Extended:
        return await self.inner.extend(claim)

    async def force_release(self, key: str) -> Record | None:
        return await self.inner.force_release(key)

    async def aclose(self) -> None:
        await self.inner.aclose()
