"""The store contract (protocol v2), from the public conformance kit, on every store:
MemoryStore, DynamoDB (moto), Redis and Redis Cluster (the ``store`` fixture of conftest)."""

from __future__ import annotations

import pytest

from idempotency_async.stores.base import Store
from idempotency_async.testing import StoreContract


class TestEveryStore(StoreContract):
    @pytest.fixture
    def store(self, store: Store) -> Store:
        return store  # conftest's store, one per backend
