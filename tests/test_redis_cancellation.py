"""A call cancelled while its Redis command is on its way ends cancelled.

redis-py sends through ``asyncio.wait_for`` when the client has a ``socket_timeout``; on
Python 3.11 a cancellation that arrives as the send finishes is swallowed there and the
command answers as if nothing happened.  Without the store's guard the cancelled call went
on to claim, run its callback, complete and return (found by the handler test kit).
Against the session's real redis-server."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis.asyncio as redis_asyncio
from _redis import *  # noqa: F403

from idempotency_async import Manager, Options
from idempotency_async.stores.redis import RedisStore

pytestmark = pytest.mark.redis

_ROUNDS = 12  # attempts at each number of loop turns before the cancel
_TURNS = 8  # a claim's send and answer take a few turns of the loop


async def _one() -> int:
    return 1


async def test_a_caller_cancelled_mid_command_ends_cancelled(redis_server: Any) -> None:
    client = redis_asyncio.Redis(port=redis_server.port, socket_timeout=5.0)
    store = RedisStore(client, key_prefix=f"cancel-{uuid.uuid4().hex[:8]}:")
    manager = Manager(store, Options(event_key_jmespath="id"))
    ran_after_cancel: list[int] = []
    carried_on: list[tuple[int, object]] = []
    try:
        # A connection in the pool: the cancels then land on the command's send itself.
        assert await manager.execute({"id": "warm"}, _one, timeout=5) == 1
        for turns in range(_TURNS):
            for attempt in range(_ROUNDS):
                cancelled: list[bool] = []  # set once the caller is cancelled
                payload = {"id": f"{turns}-{attempt}"}

                async def charge(
                    label: int = turns * 100 + attempt, cancelled: list[bool] = cancelled
                ) -> int:
                    if cancelled:
                        ran_after_cancel.append(label)
                    return label

                task = asyncio.create_task(manager.execute(payload, charge, timeout=5))
                for _ in range(turns):
                    await asyncio.sleep(0)
                if task.done():
                    continue
                task.cancel()
                cancelled.append(True)
                try:
                    result = await task
                except asyncio.CancelledError:
                    continue
                carried_on.append((turns, result))
    finally:
        await store.aclose()
        await client.aclose()
    assert carried_on == [], f"cancelled calls that returned instead: {carried_on}"
    assert ran_after_cancel == [], f"callbacks run after their caller's cancel: {ran_after_cancel}"
