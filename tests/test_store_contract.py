"""The store contract (protocol v2), from the public conformance kit, on every store:
MemoryStore, DynamoDB (moto), Redis and Redis Cluster (the ``store`` fixture of conftest)."""

from __future__ import annotations

import pytest

from idempotency_async.errors import ConfigError
from idempotency_async.record import Claim, Completion
from idempotency_async.stores.base import Store
from idempotency_async.testing import StoreContract


class TestEveryStore(StoreContract):
    @pytest.fixture
    def store(self, store: Store) -> Store:
        return store  # conftest's store, one per backend


async def test_a_closed_store_refuses_every_operation_with_a_typed_error(store: Store) -> None:
    now = 1_700_000_000.0
    await store.aclose()
    operations = {
        "claim": lambda: store.claim(Claim("k#closed", "owner-1", now, 5.0, 60.0, None)),
        "get": lambda: store.get("k#closed", now=now),
        "complete": lambda: store.complete(
            Completion("k#closed", "owner-1", now, 60.0, None, b"1", 1)
        ),
        "release": lambda: store.release("k#closed", "owner-1"),
        "extend": lambda: store.extend(Claim("k#closed", "owner-1", now, 5.0, 60.0, None)),
        "force_release": lambda: store.force_release("k#closed"),
    }
    for name, operation in operations.items():
        with pytest.raises(ConfigError, match="was closed") as caught:
            await operation()
        assert "create a new one" in str(caught.value), name
    await store.aclose()  # closing again is harmless
