"""``Manager.replay``: a committed result read without claiming, on the memory store and
the real Postgres one (the store transactional routes read)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _postgres import PostgresServer, fresh_postgres_store

from idempotency_async import Manager, MemoryStore, Options, Wait, errors
from idempotency_async.stores.base import Store

_NOTHING = object()


@pytest.fixture(params=["memory", "postgres"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        memory = MemoryStore()
        yield memory
        await memory.aclose()
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    async with fresh_postgres_store(server) as postgres:
        yield postgres


def _manager(store: Store, **options: Any) -> Manager:
    return Manager(
        store,
        Options(
            key_prefix="t", event_key_jmespath="id", payload_validation_jmespath="body", **options
        ),
    )


async def test_a_completed_result_is_replayed_and_nothing_else_is_written(store: Store) -> None:
    manager = _manager(store)
    await manager.execute({"id": 1, "body": "a"}, _returning({"order": 7}), timeout=5)

    assert await manager.replay({"id": 1, "body": "a"}, default=_NOTHING) == {"order": 7}
    assert await manager.replay({"id": 2, "body": "a"}, default=_NOTHING) is _NOTHING
    # Reading claimed nothing: the absent key is still free for a call.
    key = manager.key_for({"id": 2, "body": "a"})
    assert key is not None
    assert (await store.get(key, now=manager.options.clock())).record is None


async def test_another_payloads_record_is_a_validation_error(store: Store) -> None:
    manager = _manager(store)
    await manager.execute({"id": 1, "body": "a"}, _returning(1), timeout=5)

    with pytest.raises(errors.PayloadValidationError):
        await manager.replay({"id": 1, "body": "b"}, default=None)


async def test_a_record_in_progress_is_refused_at_once_even_with_wait(store: Store) -> None:
    manager = _manager(store, wait=Wait(timeout=30))
    started, release = asyncio.Event(), asyncio.Event()

    async def slow() -> int:
        started.set()
        await release.wait()
        return 1

    holder = asyncio.create_task(manager.execute({"id": 1, "body": "a"}, slow, timeout=10))
    await asyncio.wait_for(started.wait(), timeout=5)
    try:
        with pytest.raises(errors.AlreadyInProgressError) as raised:
            await asyncio.wait_for(manager.replay({"id": 1, "body": "a"}, default=None), 5)
        assert raised.value.retry_after is not None and 0 < raised.value.retry_after <= 11
    finally:
        release.set()
        await holder


async def test_a_result_that_was_not_stored_is_response_not_stored(store: Store) -> None:
    manager = _manager(store)
    await manager.execute({"id": 1, "body": "a"}, _returning("x" * 400_000), timeout=5)

    with pytest.raises(errors.ResponseNotStoredError):
        await manager.replay({"id": 1, "body": "a"}, default=None)


def _returning(value: Any) -> Any:
    async def callback() -> Any:
        return value

    return callback
