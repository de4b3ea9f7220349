"""Manager.execute_call: completing at the point of no return while the work goes on."""

from __future__ import annotations

import asyncio

import pytest

from idempotency_async import Call, Manager, Options, Wait, errors
from idempotency_async.record import Completion
from idempotency_async.stores.base import Store, Written


async def test_completed_call_replays_while_its_work_goes_on(store: Store) -> None:
    manager = Manager(store, Options(wait=None))
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
    # A first request opens the store's connection: under CI's load that alone has taken
    # longer than the short timeout below (the claim answered after the cutoff).
    assert await manager.execute("warm", _value) == "ran"

    async def work(call: Call) -> str:
        await call.complete("done")
        await asyncio.sleep(0.9)  # longer than the timeout: no cutoff any more
        return "done"

    assert await manager.execute_call("slow", work, timeout=0.5) == "done"


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


async def test_released_call_returns_its_value_and_a_retry_runs_again(store: Store) -> None:
    events: list[str] = []
    runs = 0

    async def work(call: Call) -> str:
        nonlocal runs
        runs += 1
        call.release("a server error went out as it was")
        assert call.released == "a server error went out as it was"
        return "not to be replayed"

    manager = Manager(store, Options(on_event=lambda event: events.append(event.kind)))
    assert await manager.execute_call("rel", work, timeout=5) == "not to be replayed"
    assert "released" in events and "completed" not in events
    # Nothing was recorded: the key is claimable at once and the work runs again.
    assert await Manager(store).execute_call("rel", work, timeout=5) == "not to be replayed"
    assert runs == 2


async def test_release_after_completion_and_completion_after_release_are_refused(
    store: Store,
) -> None:
    manager = Manager(store)

    async def completes_then_releases(call: Call) -> None:
        await call.complete("answer")
        with pytest.raises(errors.ConfigError, match="never released"):
            call.release("too late")

    async def releases_then_completes(call: Call) -> None:
        call.release("a server error")
        with pytest.raises(errors.ConfigError, match="cannot be completed"):
            await call.complete("answer")
        with pytest.raises(errors.ConfigError, match="non-empty str"):
            call.release("")

    await manager.execute_call("a", completes_then_releases, timeout=5)
    assert await Manager(store).execute("a", _never) == "answer"
    await manager.execute_call("b", releases_then_completes, timeout=5)
    assert await Manager(store).execute("b", _value) == "ran"


class _LostCompletionAnswer:
    """The store, but the first completion with a response is applied and its answer lost:
    the caller cannot tell whether the record holds it."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.lost = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def complete(self, completion: Completion) -> Written:
        written = await self.inner.complete(completion)
        if completion.encoded is not None and not self.lost:
            self.lost = True
            raise errors.StoreUnavailableError("the completion's answer was lost (injected)")
        return written


async def test_a_kept_response_is_what_waiters_in_this_process_get(store: Store) -> None:
    # The response landed, its answer lost; the callback then completes without one, and
    # the store keeps the response (final).  A duplicate waiting in this process must be
    # given what the store holds, not the "not stored" completion this call sent.
    manager = Manager(_LostCompletionAnswer(store), Options(wait=Wait(timeout=5)))  # type: ignore[arg-type]
    entered = asyncio.Event()
    go_on = asyncio.Event()

    async def work(call: Call) -> str:
        entered.set()
        await go_on.wait()
        with pytest.raises(errors.CompletionError):
            await call.complete("answer")
        await call.complete_without_response("could not tell whether it was stored")
        return "answer"

    first = asyncio.create_task(manager.execute_call({"k": 9}, work, timeout=5))
    await entered.wait()
    waiter = asyncio.create_task(manager.execute({"k": 9}, _never, timeout=5))
    await asyncio.sleep(0.05)  # the duplicate joins this process's call
    go_on.set()
    assert await first == "answer"
    assert await waiter == "answer"
    assert await manager.execute({"k": 9}, _never, timeout=5) == "answer"
