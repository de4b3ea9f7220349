"""The fault simulator on the project's stores: MemoryStore on a virtual clock (20,000
scenarios); DynamoDB on the moto server and Redis on a real redis-server in real time."""

from __future__ import annotations

import os
from typing import Any

import pytest
from _moto import fresh_table
from _redis import RedisServer

from idempotency_async import MemoryStore
from idempotency_async.record import Claim, Completion
from idempotency_async.stores.base import Written
from idempotency_async.stores.dynamodb import DynamoDBStore
from idempotency_async.stores.redis import RedisStore
from idempotency_async.testing import SimulationFailure, simulate, simulate_live

# More seeds locally: SIM_MEMORY_SEEDS=200000 SIM_LIVE_SEEDS=2000 python -m pytest ...
MEMORY_SEEDS = int(os.environ.get("SIM_MEMORY_SEEDS", "20000"))
LIVE_SEEDS = int(os.environ.get("SIM_LIVE_SEEDS", "150"))
REDIS_SEEDS = int(os.environ.get("SIM_REDIS_SEEDS", "100"))


def test_memory_store_keeps_the_guarantee() -> None:
    report = simulate(MemoryStore, range(MEMORY_SEEDS), workers=2)
    assert report.scenarios == MEMORY_SEEDS
    assert report.faults >= MEMORY_SEEDS  # at least one per scenario
    # Every documented outcome shows up, so the checks are not vacuous.
    for outcome in (
        "value",
        "AlreadyInProgressError",
        "LeaseLostError",
        "CompletionError",
        "ResponseNotStoredError",
        "CancelledError",
        "DeadlineExceededError",
    ):
        assert report.outcomes.get(outcome, 0) > 0, outcome


class _UnfencedStore(MemoryStore):
    """A store with a classic bug: completion does not check the owner token."""

    async def complete(self, completion: Completion) -> Written:
        current = (await self.get(completion.key, now=completion.now)).record
        if current is not None and current.owner != completion.owner:
            await self.force_release(completion.key)
            await self.claim(Claim(completion.key, completion.owner, completion.now, 1.0, 1.0))
        return await super().complete(completion)


def test_a_store_bug_fails_with_the_seed_and_the_command_to_rerun_it() -> None:
    with pytest.raises(SimulationFailure) as caught:
        simulate(_UnfencedStore, range(2000))
    text = str(caught.value)
    assert f"seed {caught.value.seed} broke the guarantee" in text
    assert "store: completion" in text and "must fence" in text
    assert f"rerun: python -m idempotency_async.testing --seed {caught.value.seed}" in text
    assert "call 0: CallPlan(" in text  # the scenario itself is printed


@pytest.mark.dynamodb
async def test_dynamodb_store_keeps_the_guarantee_in_real_time(dynamodb_client: Any) -> None:
    table = await fresh_table(dynamodb_client)
    report = await simulate_live(
        lambda: DynamoDBStore(dynamodb_client, table_name=table),
        range(LIVE_SEEDS),
        scale=0.05,
        concurrency=8,
        tolerance=1.0,  # loop lag on a busy machine; the store's behaviour is what counts here
    )
    assert report.scenarios == LIVE_SEEDS


async def test_redis_store_keeps_the_guarantee_in_real_time(redis_server: RedisServer) -> None:
    # Client clock: the simulator moves each manager's clock and judges by the now it sent.
    client = redis_server.client()
    try:
        report = await simulate_live(
            lambda: RedisStore(client, clock="client"),
            range(REDIS_SEEDS),
            scale=0.05,
            concurrency=8,
            tolerance=1.0,
        )
    finally:
        await client.aclose()
    assert report.scenarios == REDIS_SEEDS
