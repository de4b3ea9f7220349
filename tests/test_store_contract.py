"""The store contract (protocol v2), from the public conformance kit, on every store:
MemoryStore, DynamoDB (moto, both transports), Redis and Redis Cluster, Postgres (the
``store`` fixture of conftest); its steps section on the stores that record steps."""

from __future__ import annotations

import pytest
from conftest import STORES

from idempotency_async import Manager, MemoryStore, Options, step
from idempotency_async.errors import ConfigError
from idempotency_async.record import Claim, Completion, Status
from idempotency_async.stores.base import Extended, RecordsSteps, StepWrite, Store
from idempotency_async.testing import StepsContract, StoreContract

RECORDS_STEPS = {"memory", "dynamodb", "dynamodb-light", "redis", "redis-cluster", "postgres"}
"""The conftest backends whose store records steps (recovery points): StepsContract runs on
these, and every other must refuse ``step()``.  Enabling a backend is adding its name."""


class TestEveryStore(StoreContract):
    @pytest.fixture
    def store(self, store: Store) -> Store:
        return store  # conftest's store, one per backend


@pytest.mark.parametrize("store", sorted(RECORDS_STEPS), indirect=True)
class TestEveryStoreThatRecordsSteps(StepsContract):
    @pytest.fixture
    def store(self, store: Store) -> Store:
        return store  # conftest's store, for the backends that record steps


def test_the_backends_recording_steps_are_conftest_backends() -> None:
    assert set(STORES) >= RECORDS_STEPS, RECORDS_STEPS - set(STORES)


async def test_a_store_records_steps_or_refuses_them_before_they_run(
    store: Store, request: pytest.FixtureRequest
) -> None:
    """No backend is silently left out of the steps section: one not in RECORDS_STEPS
    must refuse a step (ConfigError, its function not run); one that has ``record_step``
    must be in it."""
    backend = request.node.callspec.params["store"]
    manager = Manager(store, Options(key_prefix="contract-steps"))
    ran: list[str] = []

    async def charge() -> str:
        ran.append("charge")
        return "ch_1"

    async def callback() -> str:
        return await step("charge", charge)

    if backend in RECORDS_STEPS:
        assert isinstance(store, RecordsSteps), f"{backend} is in RECORDS_STEPS"
        assert await manager.execute({"id": 1}, callback, timeout=10) == "ch_1"
        assert ran == ["charge"]
        return
    assert not isinstance(store, RecordsSteps), (
        f"{backend} records steps now: add it to RECORDS_STEPS (tests/test_store_contract.py) "
        "to run StepsContract on it"
    )
    with pytest.raises(ConfigError, match="does not record steps"):
        await manager.execute({"id": 1}, callback, timeout=10)
    assert ran == [], "the step's function ran on a store that cannot record it"


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
    if isinstance(store, RecordsSteps):
        write = StepWrite("k#closed", "owner-1", now, 60.0, 0, '[["a",1]]')
        operations["record_step"] = lambda: store.record_step(write)
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
