"""The store contract (protocol v2) as a pytest suite a store's own tests subclass.

    from idempotency_async.testing import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        async def store(self):
            store = MyStore(...)
            yield store
            await store.aclose()

Needs pytest and pytest-asyncio (the tests are coroutines marked ``asyncio``).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from idempotency_async._json import encode_json
from idempotency_async.record import Claim, Completion, Record, Status
from idempotency_async.stores.base import (
    CLAIMED,
    Extended,
    Found,
    RecordsSteps,
    Stepped,
    StepWrite,
    Store,
    Written,
)

__all__ = ["StepsContract", "StoreContract"]

NOW = 1_700_000_000.0


def claim(
    key: str = "k#1", owner: str = "owner-a", *, lease_s: float = 30, now: float = NOW
) -> Claim:
    return Claim(key, owner, now, lease_s, 3600.0, "v-hash")


def completion(
    key: str = "k#1", owner: str = "owner-a", response: object = None, *, now: float = NOW
) -> Completion:
    return Completion(key, owner, now, 3600.0, "v-hash", encode_json(response), response)


async def record_of(store: Store, key: str = "k#1", now: float = NOW) -> Any:
    """The record of ``key`` (typed loosely: the tests read its fields directly)."""
    record: Record | None = (await store.get(key, now=now)).record
    return record


@pytest.mark.asyncio
class StoreContract:
    """Every test a store must pass.  Override the ``store`` fixture: a fresh, empty store."""

    @pytest.fixture
    def store(self) -> Store:
        raise NotImplementedError("override the store fixture: yield a fresh, empty store")

    async def test_claim_of_free_key_writes_an_in_progress_record(self, store: Store) -> None:
        assert (await store.claim(claim())).found is Found.CLAIMED
        verdict = await store.get("k#1", now=NOW)
        assert verdict.found is Found.IN_PROGRESS
        record = verdict.record
        assert record is not None
        assert record.status is Status.INPROGRESS
        assert record.owner == "owner-a"
        assert record.validation == "v-hash"
        assert record.lease_end is not None and abs(record.lease_end - (NOW + 30)) < 0.002
        assert record.expiration == math.ceil(NOW + 3600)

    async def test_a_successful_claim_is_the_shared_claimed_verdict(self, store: Store) -> None:
        assert await store.claim(claim()) is CLAIMED

    async def test_conflicting_claim_returns_the_existing_record_and_time_left(
        self, store: Store
    ) -> None:
        await store.claim(claim(owner="owner-a"))
        verdict = await store.claim(claim(owner="owner-b", now=NOW + 1))
        assert verdict.found is Found.IN_PROGRESS
        assert verdict.record is not None and verdict.record.owner == "owner-a"
        assert verdict.retry_after is not None and abs(verdict.retry_after - 29) < 0.01
        assert (await record_of(store)).owner == "owner-a"

    async def test_a_claim_sent_again_meets_itself_and_is_claimed(self, store: Store) -> None:
        # The first answer was lost and the client retried: the record it meets is its own.
        assert (await store.claim(claim(owner="owner-a"))).found is Found.CLAIMED
        again = await store.claim(claim(owner="owner-a", now=NOW + 0.2))
        assert again.found is Found.CLAIMED
        assert (await record_of(store)).owner == "owner-a"

    async def test_a_completed_record_is_not_reclaimed_by_its_own_token(self, store: Store) -> None:
        await store.claim(claim(owner="owner-a"))
        assert await store.complete(completion(response=1)) is Written.RESPONSE
        verdict = await store.claim(claim(owner="owner-a", now=NOW + 1))
        assert verdict.found is Found.COMPLETED

    async def test_claim_succeeds_once_the_lease_has_lapsed(self, store: Store) -> None:
        await store.claim(claim(owner="owner-a", lease_s=5))
        assert (await store.claim(claim(owner="owner-b", now=NOW + 4))).found is Found.IN_PROGRESS
        assert (await store.claim(claim(owner="owner-b", now=NOW + 6))).found is Found.CLAIMED
        assert (await record_of(store, now=NOW + 6)).owner == "owner-b"

    async def test_completed_record_blocks_claims_until_it_expires(self, store: Store) -> None:
        await store.claim(claim())
        assert await store.complete(completion(response={"ok": 1})) is Written.RESPONSE
        verdict = await store.claim(claim(owner="owner-b", now=NOW + 100))
        assert verdict.found is Found.COMPLETED
        assert verdict.record is not None and verdict.record.response == {"ok": 1}
        later = NOW + 3601
        assert (await store.claim(claim(owner="owner-b", now=later))).found is Found.CLAIMED

    async def test_sub_second_ttl_is_rounded_up_not_down(self, store: Store) -> None:
        short = Claim("k#1", "owner-a", NOW + 0.25, 0.5, 0.5, None)
        await store.claim(short)
        done = Completion("k#1", "owner-a", NOW + 0.3, 0.5, None, encode_json(7), 7)
        assert await store.complete(done) is Written.RESPONSE
        record = await record_of(store, now=NOW + 0.3)
        assert record.expiration == math.ceil(NOW + 0.8)
        assert (await store.claim(claim(owner="owner-b", now=NOW + 0.5))).found is Found.COMPLETED

    async def test_expiry_is_never_before_the_lease_end(self, store: Store) -> None:
        await store.claim(Claim("k#1", "owner-a", NOW, 7200.0, 60.0, None))
        record = await record_of(store)
        assert record.expiration >= NOW + 7200

    async def test_get_judges_by_now(self, store: Store) -> None:
        assert (await store.get("k#1", now=NOW)).found is Found.CLAIMABLE
        assert (await store.get("k#1", now=NOW)).record is None
        await store.claim(claim(lease_s=5))
        assert (await store.get("k#1", now=NOW + 1)).found is Found.IN_PROGRESS
        lapsed = await store.get("k#1", now=NOW + 6)
        assert lapsed.found is Found.CLAIMABLE and lapsed.record is not None

    async def test_complete_by_a_stale_owner_is_refused_and_changes_nothing(
        self, store: Store
    ) -> None:
        await store.claim(claim(owner="owner-a", lease_s=1))
        await store.claim(claim(owner="owner-b", now=NOW + 2))
        assert (
            await store.complete(completion(owner="owner-a", response="zombie")) is Written.NOTHING
        )
        record = await record_of(store, now=NOW + 2)
        assert record.owner == "owner-b" and record.status is Status.INPROGRESS

    async def test_complete_sent_again_by_its_owner_succeeds(self, store: Store) -> None:
        await store.claim(claim())
        assert await store.complete(completion(response="once")) is Written.RESPONSE
        assert await store.complete(completion(response="once")) is Written.RESPONSE
        assert (await record_of(store)).response == "once"

    async def test_a_response_can_be_attached_to_a_record_completed_without_one(
        self, store: Store
    ) -> None:
        await store.claim(claim())
        bare = Completion("k#1", "owner-a", NOW, 3600.0, "v-hash", None, None, "stream")
        assert await store.complete(bare) is Written.WITHOUT_RESPONSE
        record = await record_of(store)
        assert record.response_stored is False and record.not_stored == "stream"
        assert await store.complete(completion(response={"late": True})) is Written.RESPONSE
        record = await record_of(store)
        assert record.response_stored is True and record.response == {"late": True}
        assert await store.complete(completion(owner="owner-b", response=1)) is Written.NOTHING

    async def test_a_completion_without_a_response_never_takes_the_owners_response_back(
        self, store: Store
    ) -> None:
        # A stream's first completion (no response), its answer lost, resent and landing
        # after the body was attached: a response is final.  Nothing is written, and the
        # answer says what the record holds.
        await store.claim(claim())
        bare = Completion("k#1", "owner-a", NOW, 3600.0, "v-hash", None, None, "stream")
        assert await store.complete(bare) is Written.WITHOUT_RESPONSE
        assert await store.complete(completion(response={"body": 1})) is Written.RESPONSE
        late = bare._replace(now=NOW + 5)
        assert await store.complete(late) is Written.RESPONSE, "a late bare completion"
        record = await record_of(store)
        assert record.response_stored is True and record.response == {"body": 1}, record
        assert record.not_stored is None, record
        assert record.expiration == math.ceil(NOW + 3600), "the kept record was rewritten"
        # A response of None is a response too; another owner is fenced as ever.
        await store.claim(claim("k#2"))
        assert await store.complete(completion("k#2", response=None)) is Written.RESPONSE
        assert await store.complete(late._replace(key="k#2")) is Written.RESPONSE
        record = await record_of(store, "k#2")
        assert record.response_stored is True and record.response is None, record
        stranger = late._replace(owner="owner-b")
        assert await store.complete(stranger) is Written.NOTHING
        assert (await record_of(store)).response == {"body": 1}

    async def test_release_by_a_stale_owner_is_refused(self, store: Store) -> None:
        await store.claim(claim(owner="owner-a", lease_s=1))
        await store.claim(claim(owner="owner-b", now=NOW + 2))
        assert await store.release("k#1", "owner-a") is False
        assert (await record_of(store, now=NOW + 2)).owner == "owner-b"

    async def test_release_by_the_owner_deletes_the_record(self, store: Store) -> None:
        await store.claim(claim())
        assert await store.release("k#1", "owner-a") is True
        assert await record_of(store) is None
        assert (await store.claim(claim(owner="owner-b"))).found is Found.CLAIMED

    async def test_release_of_a_missing_record_counts_as_released(self, store: Store) -> None:
        assert await store.release("k#1", "owner-a") is True

    async def test_force_release_deletes_any_record_and_returns_it(self, store: Store) -> None:
        await store.claim(claim())
        await store.complete(completion(response=1))
        deleted = await store.force_release("k#1")
        assert deleted is not None and deleted.status is Status.COMPLETED and deleted.response == 1
        assert await record_of(store) is None
        assert await store.force_release("k#1") is None

    async def test_complete_of_a_missing_record_is_refused(self, store: Store) -> None:
        assert await store.complete(completion(response=1)) is Written.NOTHING
        assert await record_of(store) is None

    async def test_responses_round_trip_with_identical_types(self, store: Store) -> None:
        values: list[object] = [
            0,
            "",
            [],
            {},
            False,
            None,
            0.1,
            -1.5e-10,
            2**63,
            2**70,
            -(2**64),
            1e300,
            "café 😀\u2028",
            {"nested": [1, 2.5, {"deep": [None, True, "x"]}], "empty": {"a": []}},
        ]
        for index, value in enumerate(values):
            key = f"k#{index}"
            await store.claim(claim(key))
            assert await store.complete(completion(key, response=value)) is Written.RESPONSE
            record = await record_of(store, key)
            assert record is not None and record.status is Status.COMPLETED
            assert record.response == value
            assert _types(record.response) == _types(value), value

    async def test_a_response_the_backend_cannot_hold_as_is_still_completes(
        self, store: Store
    ) -> None:
        # Lone surrogates (not UTF-8), integers beyond 64 bits, nesting beyond orjson's
        # 254 levels: stored another way that replays the same value, or completed "not
        # stored" with a reason; never an exception that leaves the record in progress.
        deep: object = 1
        for _ in range(300):
            deep = [deep]
        values: list[object] = [
            {"n": 2**70, "s": "\ud800"},
            {"\udfff": ["x\ud800y", 2**64]},
            deep,
        ]
        for index, value in enumerate(values):
            key = f"k#odd{index}"
            await store.claim(claim(key))
            written = await store.complete(completion(key, response=value))
            record = await record_of(store, key)
            assert record is not None and record.status is Status.COMPLETED
            if written is Written.RESPONSE:
                assert record.response == value
                assert _types(record.response) == _types(value)
            else:
                assert written is Written.WITHOUT_RESPONSE
                assert record.response_stored is False and record.not_stored

    async def test_response_not_stored_marker_round_trips_with_its_reason(
        self, store: Store
    ) -> None:
        await store.claim(claim())
        done = Completion(
            "k#1", "owner-a", NOW, 3600.0, "v-hash", None, None, "too large (9 bytes)"
        )
        assert await store.complete(done) is Written.WITHOUT_RESPONSE
        record = await record_of(store)
        assert record is not None
        assert record.status is Status.COMPLETED and record.response_stored is False
        assert record.not_stored == "too large (9 bytes)"

    async def test_each_read_returns_an_independent_copy(self, store: Store) -> None:
        await store.claim(claim())
        await store.complete(completion(response={"items": [1, 2]}))
        first = await record_of(store)
        first.response["items"].append(3)
        second = await record_of(store)
        assert second.response == {"items": [1, 2]}

    async def test_a_completed_verdict_says_how_long_the_record_lives(self, store: Store) -> None:
        # The local cache keeps a replay for this long, counted by the store's clock.
        await store.claim(claim())
        await store.complete(completion(response=1))
        verdict = await store.claim(claim(owner="owner-b", now=NOW + 100))
        assert verdict.found is Found.COMPLETED
        assert verdict.expires_in is not None
        assert abs(verdict.expires_in - (math.ceil(NOW + 3600) - (NOW + 100))) < 0.01
        read = await store.get("k#1", now=NOW + 200)
        assert read.expires_in is not None
        assert abs(read.expires_in - (math.ceil(NOW + 3600) - (NOW + 200))) < 0.01

    async def test_extend_moves_the_lease_and_the_expiry_of_its_owner(self, store: Store) -> None:
        await store.claim(claim(lease_s=5))
        renewed = Claim("k#1", "owner-a", NOW + 4, 5.0, 60.0, "v-hash")
        assert await store.extend(renewed) is Extended.RENEWED
        # Held past the first lease's end, free once the renewed one ends.
        assert (await store.claim(claim(owner="owner-b", now=NOW + 6))).found is Found.IN_PROGRESS
        record = await record_of(store, now=NOW + 6)
        assert record.owner == "owner-a" and record.status is Status.INPROGRESS
        assert record.lease_end is not None and abs(record.lease_end - (NOW + 9)) < 0.002
        assert record.validation == "v-hash"
        assert record.expiration == math.ceil(NOW + 4 + 60)
        assert (await store.claim(claim(owner="owner-b", now=NOW + 9.5))).found is Found.CLAIMED

    async def test_extend_of_a_lapsed_lease_nobody_took_is_still_the_owners(
        self, store: Store
    ) -> None:
        await store.claim(claim(lease_s=1))
        renewed = Claim("k#1", "owner-a", NOW + 3, 5.0, 3600.0, "v-hash")
        assert await store.extend(renewed) is Extended.RENEWED
        assert (await store.claim(claim(owner="owner-b", now=NOW + 4))).found is Found.IN_PROGRESS

    async def test_extend_is_fenced_by_the_owner(self, store: Store) -> None:
        await store.claim(claim(owner="owner-a", lease_s=1))
        await store.claim(claim(owner="owner-b", now=NOW + 2))
        stale = Claim("k#1", "owner-a", NOW + 2, 600.0, 3600.0, "v-hash")
        assert await store.extend(stale) is Extended.LOST
        record = await record_of(store, now=NOW + 2)
        assert record.owner == "owner-b" and abs(record.lease_end - (NOW + 32)) < 0.002

    async def test_extend_of_a_completed_or_missing_record_is_refused(self, store: Store) -> None:
        renewal = Claim("k#1", "owner-a", NOW + 1, 30.0, 3600.0, "v-hash")
        assert await store.extend(renewal) is Extended.LOST
        assert await record_of(store) is None
        await store.claim(claim())
        await store.complete(completion(response=1))
        assert await store.extend(renewal) is Extended.LOST
        record = await record_of(store)
        assert record.status is Status.COMPLETED and record.response == 1

    async def test_extend_never_moves_a_lease_end_back(self, store: Store) -> None:
        # Renewals sent at NOW+2 and NOW+1; the older one lands last (its answer was slow,
        # or the manager abandoned it).  On a store judging by the client's clock, moving
        # the lease end back would let another worker claim while the owner still runs.
        await store.claim(claim(lease_s=5))
        newer = Claim("k#1", "owner-a", NOW + 2, 10.0, 60.0, "v-hash")
        older = Claim("k#1", "owner-a", NOW + 1, 10.0, 60.0, "v-hash")
        assert await store.extend(newer) is Extended.RENEWED
        assert await store.extend(older) is Extended.ALREADY_LATER
        record = await record_of(store, now=NOW + 2)
        assert record.owner == "owner-a" and record.status is Status.INPROGRESS
        assert record.lease_end is not None and abs(record.lease_end - (NOW + 12)) < 0.002
        assert record.expiration == math.ceil(NOW + 2 + 60)
        verdict = await store.claim(claim(owner="owner-b", now=NOW + 11.5))
        assert verdict.found is Found.IN_PROGRESS
        assert verdict.retry_after is not None and abs(verdict.retry_after - 0.5) < 0.01

    async def test_extend_sent_again_is_renewed_again(self, store: Store) -> None:
        # An SDK retry after a lost answer: the lease already ends where it asks.
        await store.claim(claim(lease_s=5))
        renewal = Claim("k#1", "owner-a", NOW + 2, 10.0, 60.0, "v-hash")
        assert await store.extend(renewal) is Extended.RENEWED
        assert await store.extend(renewal) is Extended.RENEWED
        record = await record_of(store, now=NOW + 2)
        assert record.lease_end is not None and abs(record.lease_end - (NOW + 12)) < 0.002

    async def test_a_shorter_renewal_never_shortens_the_lease(self, store: Store) -> None:
        # The last renewal before a deadline asks only for the time left: sent later, but
        # ending earlier than a lease already held, it leaves that lease as it is.
        await store.claim(claim(lease_s=30))
        short = Claim("k#1", "owner-a", NOW + 5, 2.0, 60.0, "v-hash")
        assert await store.extend(short) is Extended.ALREADY_LATER
        record = await record_of(store, now=NOW + 5)
        assert record.lease_end is not None and abs(record.lease_end - (NOW + 30)) < 0.002
        assert record.expiration == math.ceil(NOW + 3600)

    async def test_concurrent_claims_of_one_key_have_exactly_one_winner(self, store: Store) -> None:
        verdicts = await asyncio.gather(
            *(store.claim(claim(owner=f"owner-{n}")) for n in range(20))
        )
        winners = [v for v in verdicts if v.found is Found.CLAIMED]
        assert len(winners) == 1
        record = await record_of(store)
        losers = {v.record.owner for v in verdicts if v.record is not None}
        assert losers == {record.owner}

    # -- every claim path, raced; every field, round-tripped -------------------------

    async def test_every_claim_path_raced_has_exactly_one_winner(self, store: Store) -> None:
        """Concurrent claims of a key on each path a claim can take: expired, lapsed
        lease, released, and an owner's resent claim (lapsed and live).  A store whose
        takeover reads, then writes (as the Powertools ports do) passes a race on a fresh
        key, and fails here: two retries of a crashed holder's key would both run."""
        for path in _RACED_PATHS:
            key = "k#race-" + path.replace(",", "").replace(" ", "-")
            now = await _prepare_race(store, path, key)
            owners = ["owner-a"] * 3 if path.startswith("own") else []
            owners += [f"owner-{n}" for n in range(RACERS - len(owners))]
            winner = await _race_has_one_owner(
                store, path, [claim(key, o, now=now) for o in owners]
            )
            if path == "own token, live":
                assert winner == "owner-a", f"{path}: the live lease went to {winner}"

    async def test_every_field_of_a_record_round_trips_through_its_completion(
        self, store: Store
    ) -> None:
        """Key, status, owner and validation hash come back from every read, before and
        after the completion (with or without its response).  A store that drops the
        validation hash would replay one payload's response to another (a missing hash
        is not a match)."""
        for key, encoded, response in (("k#with", encode_json(5), 5), ("k#without", None, None)):
            await store.claim(Claim(key, "owner-a", NOW, 30.0, 3600.0, "v-claimed"))
            meeting = await store.claim(claim(key, "owner-b", now=NOW + 1))
            _has_fields(meeting.record, key, Status.INPROGRESS, "owner-a", "v-claimed")
            reason = None if encoded is not None else "why"
            done = Completion(
                key, "owner-a", NOW + 2, 3600.0, "v-claimed", encoded, response, reason
            )
            written = await store.complete(done)
            assert written is (Written.RESPONSE if encoded else Written.WITHOUT_RESPONSE)
            for verdict in (
                await store.get(key, now=NOW + 3),
                await store.claim(claim(key, "owner-b", now=NOW + 3)),
            ):
                assert verdict.found is Found.COMPLETED
                _has_fields(verdict.record, key, Status.COMPLETED, "owner-a", "v-claimed")
                assert verdict.record is not None
                assert verdict.record.response_stored is (encoded is not None)
                assert verdict.record.response == response
                assert verdict.record.expiration == math.ceil(NOW + 2 + 3600)
        # No hash claimed, none stored.
        await store.claim(Claim("k#none", "owner-a", NOW, 30.0, 3600.0, None))
        await store.complete(Completion("k#none", "owner-a", NOW, 3600.0, None, b"1", 1))
        _has_fields(await record_of(store, "k#none"), "k#none", Status.COMPLETED, "owner-a", None)


RACERS = 12
_RACED_PATHS = ("expired", "lapsed lease", "released", "own token, lapsed", "own token, live")


async def _prepare_race(store: Store, path: str, key: str) -> float:
    """Write the record ``path`` races on; the time the race runs at."""
    if path == "expired":
        await store.claim(claim(key, "owner-old"))
        await store.complete(completion(key, "owner-old", 1))
        return NOW + 3601  # past ceil(NOW + 3600)
    if path == "released":
        await store.claim(claim(key, "owner-failed"))
        assert await store.release(key, "owner-failed") is True
        return NOW + 1
    if path == "own token, live":
        await store.claim(claim(key, "owner-a"))
        return NOW + 1
    owner = "owner-a" if path.startswith("own") else "owner-crashed"
    await store.claim(claim(key, owner, lease_s=5))
    return NOW + 6  # the lease has lapsed


async def _race_has_one_owner(store: Store, path: str, claims: list[Claim]) -> str:
    """Send ``claims`` of one key at once: exactly one owner's claims succeed (an owner's
    resent claim meets itself), and every other claim meets that owner's record."""
    verdicts = await asyncio.gather(*(store.claim(each) for each in claims))
    pairs = list(zip(claims, verdicts, strict=True))
    winners = {each.owner for each, verdict in pairs if verdict.found is Found.CLAIMED}
    assert len(winners) == 1, f"{path}: {len(winners)} owners claimed one key at once"
    (winner,) = winners
    for each, verdict in pairs:
        if verdict.found is not Found.CLAIMED:
            met = verdict.record.owner if verdict.record is not None else None
            assert verdict.found is Found.IN_PROGRESS and met == winner, (path, each, verdict)
    record = await record_of(store, claims[0].key, claims[0].now)
    assert record is not None and record.owner == winner, (path, record)
    assert record.status is Status.INPROGRESS, (path, record)
    assert record.lease_end is not None and record.lease_end > claims[0].now, (path, record)
    return winner


def _has_fields(
    record: Record | None, key: str, status: Status, owner: str, validation: str | None
) -> None:
    assert record is not None, key
    assert (record.key, record.status, record.owner) == (key, status, owner), record
    assert record.validation == validation, (
        f"{key}: validation hash {validation!r} came back as {record.validation!r}"
    )


def _types(value: object) -> object:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


# -- recovery points (steps): the RecordsSteps capability ------------------------------

ONE = '[["create",{"id":7}]]'
"""A step list of one step, as the manager writes it."""
TWO = '[["create",{"id":7}],["charge",null,"not a JSON value"]]'
THREE = '[["create",{"id":7}],["charge",null,"not a JSON value"],["receipt",true]]'


def step_write(
    steps: str = ONE,
    position: int = 0,
    *,
    key: str = "k#1",
    owner: str = "owner-a",
    now: float = NOW,
    ttl: float = 3600.0,
) -> StepWrite:
    return StepWrite(key, owner, now, ttl, position, steps)


async def stepped(
    store: Store, *steps: str, key: str = "k#1", owner: str = "owner-a", lease_s: float = 5
) -> None:
    """Claim ``key`` for ``owner`` at ``NOW`` (a ``lease_s`` lease) and record ``steps``
    (each the whole list after one more step), one write each, at ``NOW``."""
    assert isinstance(store, RecordsSteps), _NOT_CAPABLE
    assert await store.claim(claim(key, owner, lease_s=lease_s)) is CLAIMED
    for position, steps_after in enumerate(steps):
        written = await store.record_step(step_write(steps_after, position, key=key, owner=owner))
        assert written is Stepped.RECORDED, (position, written)


_NOT_CAPABLE = (
    "the store does not record steps (no record_step: stores.base.RecordsSteps); "
    "StepsContract checks stores that do"
)


@pytest.mark.asyncio
class StepsContract:
    """Every test a store that records steps (:class:`~idempotency_async.stores.base.RecordsSteps`)
    must pass, on top of :class:`StoreContract`: the obligations of ``RecordsSteps``,
    checked against the store protocol directly.  Override the ``store`` fixture: a fresh,
    empty store.  A store without ``record_step`` fails every test (it is not skipped)."""

    @pytest.fixture
    def store(self) -> Store:
        raise NotImplementedError("override the store fixture: yield a fresh, empty store")

    async def test_the_store_records_steps(self, store: Store) -> None:
        assert isinstance(store, RecordsSteps), _NOT_CAPABLE

    # -- record_step --------------------------------------------------------------------

    async def test_a_step_is_recorded_on_its_owners_record(self, store: Store) -> None:
        await stepped(store)
        assert isinstance(store, RecordsSteps), _NOT_CAPABLE
        assert await store.record_step(step_write(ONE, 0, now=NOW + 1)) is Stepped.RECORDED
        verdict = await store.get("k#1", now=NOW + 1)
        assert verdict.found is Found.IN_PROGRESS, verdict
        record = verdict.record
        assert record is not None and record.steps == ONE, record
        assert record.status is Status.INPROGRESS and record.owner == "owner-a", record
        assert record.validation == "v-hash", record
        assert await store.record_step(step_write(TWO, 1, now=NOW + 2)) is Stepped.RECORDED
        assert (await record_of(store, now=NOW + 2)).steps == TWO
        assert await store.record_step(step_write(THREE, 2, now=NOW + 3)) is Stepped.RECORDED
        assert (await record_of(store, now=NOW + 3)).steps == THREE

    async def test_a_step_write_sent_again_is_recorded_and_changes_nothing(
        self, store: Store
    ) -> None:
        # Its answer was lost and the client sent it again: the record already holds it.
        await stepped(store, ONE)
        assert isinstance(store, RecordsSteps), _NOT_CAPABLE
        assert await store.record_step(step_write(ONE, 0, now=NOW + 1)) is Stepped.RECORDED
        assert (await record_of(store, now=NOW + 1)).steps == ONE
        # The count is still one step: the next write applies at position 1, not 2.
        assert await store.record_step(step_write(THREE, 2, now=NOW + 1)) is Stepped.LOST
        assert await store.record_step(step_write(TWO, 1, now=NOW + 1)) is Stepped.RECORDED
        assert await store.record_step(step_write(TWO, 1, now=NOW + 2)) is Stepped.RECORDED
        assert (await record_of(store, now=NOW + 2)).steps == TWO

    async def test_a_step_write_at_another_position_is_lost(self, store: Store) -> None:
        await stepped(store)
        assert isinstance(store, RecordsSteps), _NOT_CAPABLE
        # No step yet: a write that says one came before it does not apply.
        assert await store.record_step(step_write(TWO, 1)) is Stepped.LOST
        assert (await record_of(store)).steps is None
        await store.record_step(step_write(ONE, 0))
        # One step held: another first step, or a third, does not apply.
        other = '[["other",1]]'
        assert await store.record_step(step_write(other, 0)) is Stepped.LOST
        assert await store.record_step(step_write(THREE, 2)) is Stepped.LOST
        record = await record_of(store)
        assert record.steps == ONE and record.owner == "owner-a", record

    async def test_a_step_write_is_fenced_by_the_owner(self, store: Store) -> None:
        await stepped(store, ONE, lease_s=1)
        assert isinstance(store, RecordsSteps), _NOT_CAPABLE
        assert await store.record_step(step_write(TWO, 1, owner="owner-b")) is Stepped.LOST
        assert (await record_of(store)).steps == ONE
        # Another claim took the lapsed key (keeping the step): the old owner is fenced.
        taken = await store.claim(claim(owner="owner-b", now=NOW + 2))
        assert taken.found is Found.CLAIMED, taken
        late = step_write(TWO, 1, now=NOW + 2)
        assert await store.record_step(late) is Stepped.LOST
        record = await record_of(store, now=NOW + 2)
        assert record.owner == "owner-b" and record.steps == ONE, record

    async def test_a_step_write_on_a_completed_or_missing_record_is_lost(
        self, store: Store
    ) -> None:
        assert isinstance(store, RecordsSteps), _NOT_CAPABLE
        assert await store.record_step(step_write(ONE, 0)) is Stepped.LOST
        assert await record_of(store) is None, "a step write created a record"
        await stepped(store, ONE)
        assert await store.complete(completion(response={"done": 1})) is Written.RESPONSE
        assert await store.record_step(step_write(TWO, 1, now=NOW + 1)) is Stepped.LOST
        assert await store.record_step(step_write(ONE, 0, now=NOW + 1)) is Stepped.LOST
        record = await record_of(store, now=NOW + 1)
        assert record.status is Status.COMPLETED and record.response == {"done": 1}, record
        assert record.steps is None, record

    async def test_a_step_list_past_the_stores_bound_is_too_large(self, store: Store) -> None:
        await stepped(store, ONE)
        assert isinstance(store, RecordsSteps), _NOT_CAPABLE
        filler = "x" * (store.max_response_bytes + 1)
        huge = ONE[:-1] + ',["big","' + filler + '"]]'
        assert await store.record_step(step_write(huge, 1)) is Stepped.TOO_LARGE
        record = await record_of(store)
        assert record.steps == ONE and record.owner == "owner-a", record
        assert await store.record_step(step_write(TWO, 1)) is Stepped.RECORDED

    async def test_a_step_moves_the_expiry_and_never_the_lease_end(self, store: Store) -> None:
        assert isinstance(store, RecordsSteps), _NOT_CAPABLE
        await store.claim(Claim("k#1", "owner-a", NOW, 30.0, 60.0, "v-hash"))
        assert (await record_of(store)).expiration == math.ceil(NOW + 60)
        write = step_write(ONE, 0, now=NOW + 20.5, ttl=60.0)
        assert await store.record_step(write) is Stepped.RECORDED
        record = await record_of(store, now=NOW + 21)
        assert record.expiration == math.ceil(NOW + 80.5), record
        assert record.lease_end is not None and abs(record.lease_end - (NOW + 30)) < 0.002, record
        # Never backwards: a shorter TTL leaves the expiry where it is.
        assert await store.record_step(step_write(TWO, 1, now=NOW + 21, ttl=5.0)) is (
            Stepped.RECORDED
        )
        record = await record_of(store, now=NOW + 21)
        assert record.expiration == math.ceil(NOW + 80.5), record
        assert abs(record.lease_end - (NOW + 30)) < 0.002, record
        # Held until the lease end, as before the steps.
        assert (await store.claim(claim(owner="owner-b", now=NOW + 29))).found is (
            Found.IN_PROGRESS
        )

    async def test_a_step_never_moves_the_expiry_before_the_lease_end(self, store: Store) -> None:
        assert isinstance(store, RecordsSteps), _NOT_CAPABLE
        await store.claim(Claim("k#1", "owner-a", NOW, 7200.0, 60.0, "v-hash"))
        assert await store.record_step(step_write(ONE, 0, ttl=60.0)) is Stepped.RECORDED
        record = await record_of(store)
        assert record.expiration >= NOW + 7200, record
        assert record.lease_end is not None and abs(record.lease_end - (NOW + 7200)) < 0.002

    # -- claim ----------------------------------------------------------------------------

    async def test_a_claim_after_the_lease_lapsed_keeps_the_steps(self, store: Store) -> None:
        await stepped(store, ONE, TWO)
        verdict = await store.claim(claim(owner="owner-b", now=NOW + 6))
        assert verdict.found is Found.CLAIMED, verdict
        assert verdict.record is not None, "a claim keeping steps must answer with them"
        assert verdict.record.key == "k#1" and verdict.record.steps == TWO, verdict
        record = await record_of(store, now=NOW + 6)
        assert record.owner == "owner-b" and record.steps == TWO, record
        assert record.lease_end is not None and abs(record.lease_end - (NOW + 36)) < 0.002
        # The count came along: the new owner's next step is the third.
        assert isinstance(store, RecordsSteps)
        assert await store.record_step(step_write(ONE, 0, owner="owner-b")) is Stepped.LOST
        third = step_write(THREE, 2, owner="owner-b", now=NOW + 7)
        assert await store.record_step(third) is Stepped.RECORDED
        assert (await record_of(store, now=NOW + 7)).steps == THREE

    async def test_a_claim_without_a_validation_hash_keeps_steps_recorded_without_one(
        self, store: Store
    ) -> None:
        assert isinstance(store, RecordsSteps), _NOT_CAPABLE
        await store.claim(Claim("k#1", "owner-a", NOW, 5.0, 3600.0, None))
        assert await store.record_step(step_write(ONE, 0)) is Stepped.RECORDED
        verdict = await store.claim(Claim("k#1", "owner-b", NOW + 6, 30.0, 3600.0, None))
        assert verdict.found is Found.CLAIMED and verdict.record is not None, verdict
        assert verdict.record.steps == ONE, verdict
        # A hash where none was recorded is another payload's claim.
        await store.release("k#1", "owner-b")
        other = await store.claim(Claim("k#1", "owner-c", NOW + 7, 30.0, 3600.0, "v-hash"))
        assert other.found is Found.RESUMABLE, other

    async def test_a_claim_sent_again_by_its_owner_keeps_the_steps(self, store: Store) -> None:
        await stepped(store, ONE, lease_s=30)
        verdict = await store.claim(claim(owner="owner-a", now=NOW + 1))
        assert verdict.found is Found.CLAIMED, verdict
        assert verdict.record is not None and verdict.record.steps == ONE, verdict
        record = await record_of(store, now=NOW + 1)
        assert record.owner == "owner-a" and record.steps == ONE, record
        assert isinstance(store, RecordsSteps)
        assert await store.record_step(step_write(TWO, 1, now=NOW + 1)) is Stepped.RECORDED

    async def test_a_claim_meeting_a_live_stepped_record_is_in_progress(self, store: Store) -> None:
        await stepped(store, ONE, lease_s=30)
        verdict = await store.claim(claim(owner="owner-b", now=NOW + 1))
        assert verdict.found is Found.IN_PROGRESS, verdict
        assert verdict.record is not None and verdict.record.owner == "owner-a", verdict
        assert (await record_of(store, now=NOW + 1)).steps == ONE

    async def test_an_expired_records_steps_are_dropped(self, store: Store) -> None:
        assert isinstance(store, RecordsSteps), _NOT_CAPABLE
        await store.claim(Claim("k#1", "owner-a", NOW, 5.0, 60.0, "v-hash"))
        assert await store.record_step(step_write(ONE, 0, ttl=60.0)) is Stepped.RECORDED
        later = NOW + 61  # past ceil(NOW + 60)
        verdict = await store.claim(claim(owner="owner-b", now=later))
        assert verdict.found is Found.CLAIMED, verdict
        assert verdict.record is None or verdict.record.steps is None, verdict
        record = await record_of(store, now=later)
        assert record.owner == "owner-b" and record.steps is None, record
        # The count went with them: the new owner's first step is at position 0.
        assert await store.record_step(step_write(TWO, 1, owner="owner-b", now=later)) is (
            Stepped.LOST
        )
        first = step_write(ONE, 0, owner="owner-b", now=later)
        assert await store.record_step(first) is Stepped.RECORDED

    async def test_another_payloads_claim_is_resumable_and_writes_nothing(
        self, store: Store
    ) -> None:
        await stepped(store, ONE)
        other = Claim("k#1", "owner-b", NOW + 6, 30.0, 3600.0, "v-other")
        verdict = await store.claim(other)
        assert verdict.found is Found.RESUMABLE, verdict
        assert verdict.record is not None, verdict
        assert verdict.record.key == "k#1" and verdict.record.validation == "v-hash", verdict
        record = await record_of(store, now=NOW + 6)
        assert record.owner == "owner-a" and record.steps == ONE, record
        assert record.lease_end is not None and abs(record.lease_end - (NOW + 5)) < 0.002
        # Released: the same answer.
        assert await store.release("k#1", "owner-a") is True
        assert (await store.claim(other._replace(now=NOW + 7))).found is Found.RESUMABLE
        record = await record_of(store, now=NOW + 7)
        assert record.owner is None and record.steps == ONE, record
        # Its own payload still resumes it.
        mine = await store.claim(claim(owner="owner-c", now=NOW + 8))
        assert mine.found is Found.CLAIMED and mine.record is not None, mine
        assert mine.record.steps == ONE, mine

    async def test_claims_racing_for_stepped_progress_have_one_winner(self, store: Store) -> None:
        """Concurrent claims of a lapsed or released record carrying steps: exactly one
        takes it over (with the steps); every other meets the winner's record.  A takeover
        that reads the steps, then writes them back, lets two retries resume one crash."""
        for path in ("lapsed", "released"):
            key = f"k#race-{path}"
            await stepped(store, ONE, TWO, key=key, lease_s=5)
            now = NOW + 6
            if path == "released":
                assert await store.release(key, "owner-a") is True
                now = NOW + 1
            claims = [claim(key, f"owner-{n}", now=now) for n in range(RACERS)]
            verdicts = await asyncio.gather(*(store.claim(each) for each in claims))
            won = [
                (each, verdict)
                for each, verdict in zip(claims, verdicts, strict=True)
                if verdict.found is Found.CLAIMED
            ]
            assert len(won) == 1, f"{path}: {len(won)} claims took over one record"
            ((winner, verdict),) = won
            assert verdict.record is not None and verdict.record.steps == TWO, (path, verdict)
            for each, other in zip(claims, verdicts, strict=True):
                if each is not winner:
                    assert other.found is Found.IN_PROGRESS, (path, other)
                    assert other.record is not None and other.record.owner == winner.owner
            record = await record_of(store, key, now)
            assert record.owner == winner.owner and record.steps == TWO, (path, record)

    # -- extend, complete, release, force_release ---------------------------------------

    async def test_extend_keeps_the_steps(self, store: Store) -> None:
        await stepped(store, ONE, TWO)
        renewal = Claim("k#1", "owner-a", NOW + 4, 5.0, 60.0, "v-hash")
        assert await store.extend(renewal) is Extended.RENEWED
        record = await record_of(store, now=NOW + 4)
        assert record.steps == TWO and record.owner == "owner-a", record
        assert record.lease_end is not None and abs(record.lease_end - (NOW + 9)) < 0.002
        assert isinstance(store, RecordsSteps)
        assert await store.record_step(step_write(THREE, 2, now=NOW + 5)) is Stepped.RECORDED

    async def test_complete_drops_the_steps(self, store: Store) -> None:
        await stepped(store, ONE, TWO)
        assert await store.complete(completion(response={"ok": True})) is Written.RESPONSE
        verdict = await store.get("k#1", now=NOW + 1)
        assert verdict.found is Found.COMPLETED, verdict
        assert verdict.record is not None and verdict.record.steps is None, verdict
        assert verdict.record.response == {"ok": True}, verdict
        replayed = await store.claim(claim(owner="owner-b", now=NOW + 2))
        assert replayed.found is Found.COMPLETED, replayed
        assert replayed.record is not None and replayed.record.steps is None, replayed

    async def test_complete_without_a_response_drops_the_steps(self, store: Store) -> None:
        await stepped(store, ONE)
        bare = Completion("k#1", "owner-a", NOW, 3600.0, "v-hash", None, None, "why")
        assert await store.complete(bare) is Written.WITHOUT_RESPONSE
        record = await record_of(store, now=NOW + 1)
        assert record.status is Status.COMPLETED and record.steps is None, record

    async def test_release_of_a_stepped_record_keeps_its_progress(self, store: Store) -> None:
        # ``release`` is sent no ``now``: the released lease end must be in the past by
        # every clock the store may be judged by — here the suite's NOW, years before the
        # machine's clock (MemoryStore writes 1.0, one second after the epoch).
        await stepped(store, ONE, TWO, lease_s=30)
        before = await record_of(store, now=NOW + 1)
        assert await store.release("k#1", "owner-a") is True
        verdict = await store.get("k#1", now=NOW + 1)
        assert verdict.found is Found.CLAIMABLE, verdict
        record = verdict.record
        assert record is not None, "the release deleted a record carrying steps"
        assert record.status is Status.INPROGRESS and record.owner is None, record
        assert record.lease_end is not None and record.lease_end < NOW + 1, record
        assert record.steps == TWO and record.validation == "v-hash", record
        assert record.expiration == before.expiration, (before, record)
        # Sent again (its answer was lost): released, and nothing changes.
        assert await store.release("k#1", "owner-a") is True
        assert await store.release("k#1", "owner-b") is True  # no claim holds the key
        assert await record_of(store, now=NOW + 1) == record
        # The released owner is fenced: it writes no step, extends nothing, completes nothing.
        assert isinstance(store, RecordsSteps)
        assert await store.record_step(step_write(THREE, 2, now=NOW + 1)) is Stepped.LOST
        renewal = Claim("k#1", "owner-a", NOW + 1, 30.0, 3600.0, "v-hash")
        assert await store.extend(renewal) is Extended.LOST
        assert await store.complete(completion(response=1, now=NOW + 1)) is Written.NOTHING
        assert await record_of(store, now=NOW + 1) == record

    async def test_a_released_record_is_resumed_at_once_by_its_payload(self, store: Store) -> None:
        await stepped(store, ONE, TWO, lease_s=30)
        assert await store.release("k#1", "owner-a") is True
        verdict = await store.claim(claim(owner="owner-b", now=NOW + 1))
        assert verdict.found is Found.CLAIMED, verdict
        assert verdict.record is not None and verdict.record.steps == TWO, verdict
        record = await record_of(store, now=NOW + 1)
        assert record.owner == "owner-b" and record.steps == TWO, record
        assert record.lease_end is not None and abs(record.lease_end - (NOW + 31)) < 0.002
        assert isinstance(store, RecordsSteps)
        assert await store.record_step(step_write(THREE, 2, owner="owner-b", now=NOW + 2)) is (
            Stepped.RECORDED
        )
        # The resumed record is released, completed, as any other.
        assert await store.complete(completion(owner="owner-b", response=3)) is Written.RESPONSE
        assert (await record_of(store, now=NOW + 3)).steps is None

    async def test_a_release_after_another_claim_took_the_key_is_refused(
        self, store: Store
    ) -> None:
        await stepped(store, ONE, lease_s=1)
        await store.claim(claim(owner="owner-b", now=NOW + 2))
        assert await store.release("k#1", "owner-a") is False
        record = await record_of(store, now=NOW + 2)
        assert record.owner == "owner-b" and record.steps == ONE, record

    async def test_force_release_removes_the_record_with_its_steps(self, store: Store) -> None:
        await stepped(store, ONE, TWO)
        deleted = await store.force_release("k#1")
        assert deleted is not None and deleted.steps == TWO, deleted
        assert await record_of(store) is None
        assert await store.claim(claim(owner="owner-b", now=NOW + 1)) is CLAIMED
        assert (await record_of(store, now=NOW + 1)).steps is None
        # Released progress is removed as well.
        await stepped(store, ONE, key="k#2")
        assert await store.release("k#2", "owner-a") is True
        assert (await store.force_release("k#2")) is not None
        assert await record_of(store, "k#2") is None
