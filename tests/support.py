"""Test helpers: a store wrapper that records calls and injects faults, and a movable clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores.base import Store, Verdict, Written


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
    """Wraps a real store: records each call, and can raise on chosen calls."""

    inner: Store
    calls: list[str] = field(default_factory=list)
    fail_on: dict[str, BaseException] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)

    @property
    def max_response_bytes(self) -> int:
        return self.inner.max_response_bytes

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        error = self.fail_on.get(name)
        if error is not None:
            raise error

    async def claim(self, claim: Claim) -> Verdict:
        self._enter("claim")
        self.claims.append(claim)
        return await self.inner.claim(claim)

    async def get(self, key: str, *, now: float) -> Verdict:
        self._enter("get")
        return await self.inner.get(key, now=now)

    async def complete(self, completion: Completion) -> Written:
        self._enter("complete")
        return await self.inner.complete(completion)

    async def release(self, key: str, owner: str) -> bool:
        self._enter("release")
        return await self.inner.release(key, owner)

    async def force_release(self, key: str) -> Record | None:
        self._enter("force_release")
        return await self.inner.force_release(key)

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
    seconds: float,
    result: Any = None,
    error: BaseException | None = None,
    timeout: float = 5.0,
) -> asyncio.Task[Any]:
    """Start ``manager.execute(payload, ...)`` whose callback holds the key for ``seconds``
    and then returns ``result`` (or raises ``error``); return once the callback is running."""
    started = asyncio.Event()

    async def hold() -> Any:
        started.set()
        await asyncio.sleep(seconds)
        if error is not None:
            raise error
        return result

    task = asyncio.create_task(manager.execute(payload, hold, timeout=timeout))
    await started.wait()
    return task
