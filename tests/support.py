"""Test helpers: a store wrapper that records calls and injects faults, and a movable clock."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores.base import Store


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

    async def claim(self, claim: Claim, *, now: float) -> Record | None:
        self._enter("claim")
        self.claims.append(claim)
        return await self.inner.claim(claim, now=now)

    async def get(self, key: str) -> Record | None:
        self._enter("get")
        return await self.inner.get(key)

    async def complete(self, completion: Completion) -> bool:
        self._enter("complete")
        return await self.inner.complete(completion)

    async def release(self, key: str, owner: str | None) -> bool:
        self._enter("release")
        return await self.inner.release(key, owner)

    async def aclose(self) -> None:
        await self.inner.aclose()


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
