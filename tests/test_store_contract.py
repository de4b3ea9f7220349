"""The store contract (protocol v2), from the public conformance kit, on every store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from _moto import fresh_store

from idempotency_async import MemoryStore
from idempotency_async.stores.base import Store
from idempotency_async.testing import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        memory = MemoryStore()
        yield memory
        await memory.aclose()


@pytest.mark.dynamodb
class TestDynamoDBStore(StoreContract):
    @pytest.fixture
    async def store(self, dynamodb_client: Any) -> AsyncIterator[Store]:
        dynamodb = await fresh_store(dynamodb_client)
        yield dynamodb
        await dynamodb.aclose()
