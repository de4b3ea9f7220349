"""Manager.execute_call: completing at the point of no return while the work goes on."""

from __future__ import annotations

import asyncio

import pytest

from idempotency_async import Call, Manager, Options, errors
from idempotency_async.stores.base import Store


async def test_completed_call_replays_while_its_work_goes_on(store: Store) -> None:
    manager = Manager(store, Options(wait=False))
    answered = asyncio.Event()
    finish = asyncio.Event()

    async def work(call: Call) -> str:
        await call.complete("answer")
        answered.set()
        await finish.wait()
        return "answer"

    first = asyncio.create_task(manager.execute_call({"k": 1}, work, timeout=5))
    await answered.wait()
    # Completed: a duplicate replays at once, in this process too, never "in progress".
    assert await manager.execute({"k": 1}, _never) == "answer"
    finish.set()
    assert await first == "answer"


async def test_failure_after_completion_never_releases_the_key(store: Store) -> None:
    manager = Manager(store)

    async def work(call: Call) -> None:
        await call.complete({"ok": True})
        raise RuntimeError("background work failed")

    with pytest.raises(RuntimeError):
        await manager.execute_call("p", work, timeout=5)
    assert await manager.execute("p", _never) == {"ok": True}


async def test_work_after_completion_runs_past_the_deadline(store: Store) -> None:
    manager = Manager(store, Options(completion_reserve=0.05))

    async def work(call: Call) -> str:
        await call.complete("done")
        await asyncio.sleep(0.6)  # longer than the timeout: no cutoff any more
        return "done"

    assert await manager.execute_call("slow", work, timeout=0.3) == "done"


async def test_before_completion_it_is_execute(store: Store) -> None:
    manager = Manager(store, Options(completion_reserve=0.05))

    async def fails(call: Call) -> None:
        raise ValueError("before the answer")

    async def hangs(call: Call) -> None:
        await asyncio.sleep(5)

    with pytest.raises(ValueError):
        await manager.execute_call("released", fails, timeout=5)
    assert await manager.execute("released", _value) == "ran"  # released, so it ran again
    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute_call("cut", hangs, timeout=0.3)


async def test_response_attached_after_completing_without_one(store: Store) -> None:
    manager = Manager(store)

    async def work(call: Call) -> None:
        await call.complete_without_response("streamed response")
        with pytest.raises(errors.ResponseNotStoredError) as not_stored:
            await Manager(store).execute("s", _never)
        assert not_stored.value.reason == "streamed response"
        assert "streamed response" in str(not_stored.value)
        await call.complete("the whole stream")
        with pytest.raises(errors.ConfigError):
            await call.complete("another answer")

    await manager.execute_call("s", work, timeout=5)
    assert await Manager(store).execute("s", _never) == "the whole stream"


async def test_callback_returning_without_completing_is_completed(store: Store) -> None:
    manager = Manager(store)

    async def work(call: Call) -> int:
        return 7

    assert await manager.execute_call("r", work, timeout=5) == 7
    assert await manager.execute_call("r", work, timeout=5) == 7
    assert manager.key_for("r") is not None


async def _never() -> object:
    raise AssertionError("the callback ran again")


async def _value() -> str:
    return "ran"


async def test_cancellation_after_completion_leaves_the_record_completed(store: Store) -> None:
    manager = Manager(store)
    answered = asyncio.Event()

    async def work(call: Call) -> None:
        await call.complete("answer")
        answered.set()
        await asyncio.sleep(10)

    task = asyncio.create_task(manager.execute_call("c", work, timeout=5))
    await answered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await Manager(store).execute("c", _never) == "answer"
