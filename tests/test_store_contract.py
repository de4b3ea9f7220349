"""The store contract (protocol v2), from the public conformance kit, on every store:
MemoryStore, DynamoDB (moto, both transports), Redis and Redis Cluster, Postgres (the
``store`` fixture of conftest)."""

from __future__ import annotations

import pytest

from idempotency_async import MemoryStore
from idempotency_async.errors import ConfigError
from idempotency_async.record import Claim, Completion, Status
from idempotency_async.stores.base import Extended, Store
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


class _OverwritingStore(MemoryStore):
    """A third-party store whose extend overwrites the lease end (the protocol before
    renewals were bounded): the kit must fail it."""

    async def extend(self, claim: Claim) -> Extended:
        verdict = await self.get(claim.key, now=claim.now)
        record = verdict.record
        if record is None or record.status is not Status.INPROGRESS or record.owner != claim.owner:
            return Extended.LOST
        # Overwritten through the store's own operations (not its private entries): the
        # record is rewritten with the lease end this renewal asks for, earlier or not.
        await self.force_release(claim.key)
        await self.claim(claim._replace(validation=record.validation))
        return Extended.RENEWED


@pytest.mark.parametrize(
    "check",
    ["test_extend_never_moves_a_lease_end_back", "test_a_shorter_renewal_never_shortens_the_lease"],
)
async def test_the_kit_fails_a_store_whose_extend_overwrites(check: str) -> None:
    store = _OverwritingStore()
    with pytest.raises(AssertionError):
        await getattr(StoreContract(), check)(store)
