"""Shared fixtures.  ``store`` runs every contract test against each real store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from support import Clock

from idempotency_async import MemoryStore
from idempotency_async.stores.base import Store

STORES = ["memory"]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        memory = MemoryStore()
        yield memory
        await memory.aclose()


from _moto import *  # noqa: E402, F403  (DynamoDB fixtures: moto_endpoint, dynamodb_client)
