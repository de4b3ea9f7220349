"""``Manager.execute`` hands back the lifecycle's coroutine: it behaves as an ``async def``.

``execute`` is a plain function (a frame of its own per call in flight cost memory), so
what it checks before the lifecycle starts must still surface where an ``async def``'s
would: when the coroutine is awaited, never at the call; and calling it outside a
running loop, as ``asyncio.run(manager.execute(...))`` does, must work.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest

from idempotency_async import Manager, MemoryStore, Options
from idempotency_async.errors import ConfigError, KeyMissingError, PayloadError
from idempotency_async.record import Claim
from idempotency_async.stores.base import Verdict


class CountingStore(MemoryStore):
    """A MemoryStore that counts the claims it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.claims = 0

    async def claim(self, claim: Claim) -> Verdict:
        self.claims += 1
        return await super().claim(claim)


async def _answer() -> str:
    return "done"


@pytest.mark.parametrize(
    ("options", "payload", "callback", "error"),
    [
        (Options(), {"id": 1}, "not a callable", ConfigError),
        (Options(), {"id": float("nan")}, _answer, PayloadError),
        (
            Options(event_key_jmespath="id", raise_on_no_key=True),
            {"x": 1},
            _answer,
            KeyMissingError,
        ),
    ],
    ids=["callback", "payload", "missing key"],
)
async def test_what_execute_refuses_is_raised_when_awaited(
    options: Options, payload: Any, callback: Any, error: type[Exception]
) -> None:
    store = CountingStore()
    pending = Manager(store, options).execute(payload, callback, timeout=5)  # no raise here
    with pytest.raises(error):
        await pending
    assert store.claims == 0


async def test_a_timeout_that_is_not_a_duration_is_raised_when_awaited() -> None:
    pending = Manager(MemoryStore()).execute({"id": 1}, _answer, timeout=float("inf"))
    with pytest.raises(ConfigError):
        await pending


async def test_an_execute_never_awaited_touches_no_store() -> None:
    store = CountingStore()
    pending = Manager(store).execute({"id": 1}, _answer, timeout=5)
    pending.close()
    await asyncio.sleep(0)
    assert store.claims == 0


def test_execute_runs_when_called_outside_a_running_loop() -> None:
    store = CountingStore()
    manager = Manager(store)
    assert asyncio.run(manager.execute({"id": 1}, _answer, timeout=5)) == "done"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left un-awaited
        assert asyncio.run(manager.execute({"id": 1}, _answer, timeout=5)) == "done"
    assert store.claims == 2  # the second call replays what the first one stored


async def test_a_call_without_a_key_still_runs_its_callback() -> None:
    manager = Manager(MemoryStore(), Options(event_key_jmespath="id"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert await manager.execute({"x": 1}, _answer, timeout=5) == "done"
