"""The conformance kit fails unsafe stores, not only correct ones pass it.

Two stores built to be wrong the way real ports are wrong:

- ``ReadThenWriteTakeover``: a fresh key is claimed atomically, but a lapsed or expired
  record is taken over by reading it, then writing over it — as the Powertools ports do.
  Two retries of a crashed holder's key can then both run.
- ``DropsValidation``: completes records without their validation hash.  A different
  payload under the same key then replays the first one's response.

- ``TakesTheResponseBack``: lets a completion without a response replace its owner's
  record completed with one — every store before the rule that a response is final.  A
  stream's first completion, its answer lost and landing after the body was attached,
  then turns every later replay into "not stored".

The kit (``StoreContract`` and the simulator) must fail all three; every real store passes
it (``tests/test_store_contract.py``, ``tests/test_simulator.py``).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from support import MemoryWrapper

from idempotency_async import Manager, MemoryStore, Options, errors
from idempotency_async.record import Claim, Completion, Status
from idempotency_async.stores.base import Found, Stepped, StepWrite, Verdict, Written
from idempotency_async.testing import SimulationFailure, StepsContract, StoreContract, simulate
from idempotency_async.testing._contract import _prepare_race, _race_has_one_owner, claim

NOW = 1_700_000_000.0


class ReadThenWriteTakeover(MemoryWrapper):
    """Takes over a lapsed or expired record in two steps: read it, then overwrite it."""

    async def claim(self, claim: Claim) -> Verdict:
        read = await self.inner.get(claim.key, now=claim.now)
        if read.record is None or read.found is not Found.CLAIMABLE:
            return await self.inner.claim(claim)  # a fresh key: one conditional write
        await asyncio.sleep(0)  # the round trip between the read and the write
        await self.inner.force_release(claim.key)  # the unconditional put, in two steps
        return await self.inner.claim(claim)


class DropsValidation(MemoryWrapper):
    """Completes records without their validation hash."""

    async def complete(self, completion: Completion) -> Written:
        return await self.inner.complete(completion._replace(validation=None))


class TakesTheResponseBack(MemoryWrapper):
    """Lets a completion without a response replace its owner's response."""

    async def complete(self, completion: Completion) -> Written:
        record = (await self.inner.get(completion.key, now=completion.now)).record
        if (
            completion.encoded is None
            and record is not None
            and record.owner == completion.owner
            and record.status is Status.COMPLETED
        ):
            # Overwrite as the stores did: the owner's record, whatever it held.
            await self.inner.force_release(completion.key)
            owned = Claim(completion.key, completion.owner, completion.now, 1.0, 1.0, None)
            await self.inner.claim(owned)
        return await self.inner.complete(completion)


async def _kit_failures(factory: Any) -> dict[str, str]:
    """Run every ``StoreContract`` test on a fresh store from ``factory``: the failing
    tests, with why."""
    failures = {}
    suite = StoreContract()
    for name, test in inspect.getmembers(suite, inspect.iscoroutinefunction):
        if not name.startswith("test_"):
            continue
        store = factory()
        try:
            await test(store)
        except AssertionError as exc:
            failures[name] = str(exc).splitlines()[0] if str(exc) else "assertion failed"
        finally:
            await store.aclose()
    return failures


async def test_the_kit_fails_a_read_then_write_takeover() -> None:
    failures = await _kit_failures(ReadThenWriteTakeover)

    # The first path raced that takes over a record: an expired one.
    assert failures == {
        "test_every_claim_path_raced_has_exactly_one_winner": (
            "expired: 12 owners claimed one key at once"
        )
    }
    # (The race the kit had before, on a fresh key, passes: that path is atomic.)
    for path in ("lapsed lease", "own token, lapsed"):
        store = ReadThenWriteTakeover()
        with pytest.raises(AssertionError, match=f"{path}: [0-9]+ owners claimed"):
            await _race(store, path)


async def _race(store: Any, path: str) -> None:
    """One path of the kit's race test on its own (the test stops at its first failure)."""
    now = await _prepare_race(store, path, "k#1")
    await _race_has_one_owner(store, path, [claim("k#1", f"o-{n}", now=now) for n in range(12)])


async def test_the_kit_fails_a_store_that_drops_the_validation_hash() -> None:
    failures = await _kit_failures(DropsValidation)

    assert failures == {
        "test_every_field_of_a_record_round_trips_through_its_completion": (
            "k#with: validation hash 'v-claimed' came back as None"
        )
    }


def test_the_simulator_fails_a_store_that_drops_the_validation_hash() -> None:
    with pytest.raises(SimulationFailure) as caught:
        simulate(DropsValidation, range(40), shrink=False)
    assert "completion of" in str(caught.value)


async def test_the_kit_fails_a_store_that_takes_the_response_back() -> None:
    failures = await _kit_failures(TakesTheResponseBack)

    assert failures == {
        "test_a_completion_without_a_response_never_takes_the_owners_response_back": (
            "a late bare completion"
        )
    }


# Seed 274, the one that found the defect, with the features left out when it was found
# (the generator's streams keep it): an HTTP stream's first completion lands late.
_GATE_LATE_SEED = 274
_GATE_LATE_EXCLUDE = ("renewal", "lambda_context", "slow_batch", "http_middleware")


def test_the_simulator_fails_a_store_that_takes_the_response_back() -> None:
    with pytest.raises(SimulationFailure) as caught:
        simulate(TakesTheResponseBack, [_GATE_LATE_SEED], exclude=_GATE_LATE_EXCLUDE, shrink=False)
    text = str(caught.value)
    # The store check names the store's fault, and the oracle the guarantee it breaks.
    assert "without a response" in text and "a response is final" in text
    assert "G6:" in text and "one key, one answer" in text
    simulate(MemoryStore, [_GATE_LATE_SEED], exclude=_GATE_LATE_EXCLUDE, shrink=False)


async def test_the_memory_store_passes_the_whole_kit() -> None:
    # The same harness on a correct store: the failures above are the stores', not its.
    assert await _kit_failures(MemoryStore) == {}


# ---------------------------------------------------------------------- what they break


async def test_the_takeover_store_runs_a_crashed_holders_retries_twice() -> None:
    store = ReadThenWriteTakeover()
    clock = [NOW]
    manager = Manager(store, Options(clock=lambda: clock[0], lease=5.0))
    key = manager.key_for({"id": "order-1"})
    assert key is not None
    await store.claim(Claim(key, "crashed", NOW, 5.0, 3600.0, None))  # then it died
    clock[0] = NOW + 6  # its lease has lapsed
    runs: list[int] = []

    async def charge() -> str:
        runs.append(1)
        await asyncio.sleep(0.01)
        return "charged"

    outcomes = await asyncio.gather(
        manager.execute({"id": "order-1"}, charge),
        Manager(store, Options(clock=lambda: clock[0], lease=5.0)).execute(
            {"id": "order-1"}, charge
        ),
        return_exceptions=True,
    )
    assert len(runs) == 2, outcomes  # what the kit now refuses to certify


async def test_the_hash_dropping_store_replays_another_payloads_response() -> None:
    manager = Manager(
        DropsValidation(),
        Options(event_key_jmespath="id", payload_validation_jmespath="amount"),
    )
    assert await manager.execute({"id": "o-1", "amount": 10}, lambda: _value("charged 10"))
    replayed = await manager.execute({"id": "o-1", "amount": 99}, lambda: _value("charged 99"))
    assert replayed == "charged 10"  # instead of PayloadValidationError
    correct = Manager(
        MemoryStore(), Options(event_key_jmespath="id", payload_validation_jmespath="amount")
    )
    await correct.execute({"id": "o-1", "amount": 10}, lambda: _value("charged 10"))
    with pytest.raises(errors.PayloadValidationError):
        await correct.execute({"id": "o-1", "amount": 99}, lambda: _value("charged 99"))


async def _value(value: str) -> str:
    return value


# ------------------------------------------------------------- the steps section (RecordsSteps)


class ReleaseDeletesSteps(MemoryStore):
    """Forgot an obligation: its release deletes a record carrying steps."""

    async def release(self, key: str, owner: str) -> bool:
        record = (await self.get(key, now=NOW)).record
        if record is not None and record.owner == owner:
            await self.force_release(key)
            return True
        return await super().release(key, owner)


class TakeoverDropsSteps(MemoryStore):
    """Takes over a lapsed or released record as a fresh claim: its steps are lost (and
    another payload's claim takes them over too)."""

    async def claim(self, claim: Claim) -> Verdict:
        read = await self.get(claim.key, now=claim.now)
        if read.found is Found.CLAIMABLE and read.record is not None:
            await self.force_release(claim.key)
        return await super().claim(claim)


class ReadThenWriteResume(MemoryStore):
    """Resumes a lapsed or released record by reading its steps, then writing a fresh
    claim and the steps back: two racing claims both resume it."""

    async def claim(self, claim: Claim) -> Verdict:
        read = await self.get(claim.key, now=claim.now)
        record = read.record
        if read.found is not Found.CLAIMABLE or record is None or record.steps is None:
            return await super().claim(claim)
        await asyncio.sleep(0)  # the round trip between the read and the writes
        await self.force_release(claim.key)
        await super().claim(claim)
        await self.record_step(
            StepWrite(claim.key, claim.owner, claim.now, claim.ttl, 0, record.steps)
        )
        return Verdict(Found.CLAIMED, (await self.get(claim.key, now=claim.now)).record)


class ResendIsLost(MemoryStore):
    """Answers a step write sent again (its answer lost) as a lost lease."""

    async def record_step(self, write: StepWrite) -> Stepped:
        record = (await self.get(write.key, now=write.now)).record
        if record is not None and record.steps == write.steps:
            return Stepped.LOST
        return await super().record_step(write)


class StepMovesTheLease(MemoryStore):
    """Renews the lease with every step write (a step must never move the lease end)."""

    async def record_step(self, write: StepWrite) -> Stepped:
        stepped = await super().record_step(write)
        if stepped is Stepped.RECORDED:
            await self.extend(Claim(write.key, write.owner, write.now, 30.0, write.ttl, "v-hash"))
        return stepped


async def _steps_failures(factory: Any) -> set[str]:
    """The ``StepsContract`` tests that fail on a fresh store from ``factory``."""
    failures = set()
    suite = StepsContract()
    for name, test in inspect.getmembers(suite, inspect.iscoroutinefunction):
        if not name.startswith("test_"):
            continue
        store = factory()
        try:
            await test(store)
        except AssertionError:
            failures.add(name)
        finally:
            await store.aclose()
    return failures


async def test_the_steps_section_fails_every_test_of_a_store_without_record_step() -> None:
    tests = {name for name in dir(StepsContract) if name.startswith("test_")}
    assert len(tests) > 15
    assert await _steps_failures(MemoryWrapper) == tests


@pytest.mark.parametrize(
    ("factory", "caught"),
    [
        (ReleaseDeletesSteps, "test_release_of_a_stepped_record_keeps_its_progress"),
        (TakeoverDropsSteps, "test_a_claim_after_the_lease_lapsed_keeps_the_steps"),
        (TakeoverDropsSteps, "test_another_payloads_claim_is_resumable_and_writes_nothing"),
        (ResendIsLost, "test_a_step_write_sent_again_is_recorded_and_changes_nothing"),
        (ReadThenWriteResume, "test_claims_racing_for_stepped_progress_have_one_winner"),
        (StepMovesTheLease, "test_a_step_moves_the_expiry_and_never_the_lease_end"),
    ],
)
async def test_the_steps_section_fails_a_store_that_breaks_an_obligation(
    factory: Any, caught: str
) -> None:
    assert caught in await _steps_failures(factory)


async def test_the_memory_store_passes_the_steps_section() -> None:
    assert await _steps_failures(MemoryStore) == set()
