"""Shared fixtures.  ``store`` runs every contract test against each real store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from _moto import dynamodb_client, fresh_store, moto_endpoint, open_client
from support import Clock

from idempotency_async import MemoryStore
from idempotency_async.stores.base import Store

__all__ = ["clock", "dynamodb_client", "moto_endpoint", "store"]

STORES = ["memory", "dynamodb"]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        memory = MemoryStore()
        yield memory
        await memory.aclose()
    else:
        async with open_client(request.getfixturevalue("moto_endpoint")) as client:
            dynamodb = await fresh_store(client)
            yield dynamodb
            await dynamodb.aclose()
