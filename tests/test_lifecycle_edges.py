"""Regression tests for the lifecycle's edge cases, on every store (the ``store`` fixture).

Each test names the fault it pins: a side effect run twice, a key blocked by nothing, a
completed key answered with "in progress", one key with two answers, or an outcome the
caller did not ask for.
"""

from __future__ import annotations

import asyncio
import base64
import math
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _moto import fresh_store, new_session
from _redis import RedisServer, fresh_redis_store
from aiobotocore.config import AioConfig
from aiohttp import web
from support import Clock, RecordingStore, on_stores, record_of, start_holding
from test_dynamodb_store import _answer_with_error, _Proxy

from idempotency_async import (
    Event,
    LocalCache,
    Manager,
    MemoryStore,
    Options,
    Renewal,
    Wait,
    deadline,
    errors,
    idempotent_function,
)
from idempotency_async.integrations.aws_lambda import idempotent_handler
from idempotency_async.record import Status
from idempotency_async.stores.base import Found, Store
from idempotency_async.stores.dynamodb import DynamoDBStore


def make(store: Store, **options: Any) -> Manager:
    options.setdefault("key_prefix", "edge")
    return Manager(store, Options(**options))


class Runs:
    """A callback that counts its starts, then sleeps and returns (or raises)."""

    def __init__(self, result: Any = "done", *, sleep: float = 0.0, error: Exception | None = None):
        self.starts = 0
        self.result = result
        self.sleep = sleep
        self.error = error

    async def __call__(self) -> Any:
        self.starts += 1
        if self.sleep:
            await asyncio.sleep(self.sleep)
        if self.error is not None:
            raise self.error
        return self.result


# -- 1. a lease without a deadline bounds the callback --------------------------------


@on_stores("memory", "dynamodb", "redis")
async def test_lease_option_cuts_the_callback_off_before_the_lease_ends(store: Store) -> None:
    events: list[Event] = []
    manager = make(store, lease=1.0, on_event=events.append)
    other = make(store)
    slow = Runs(sleep=30)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(errors.DeadlineExceededError) as caught:
        await manager.execute({"id": 1}, slow)
    elapsed = loop.time() - started
    assert isinstance(caught.value, TimeoutError)
    assert elapsed < 1.0  # cut off a reserve before the lease ends: nobody can claim yet
    assert [event.kind for event in events] == ["claimed", "cut_off"]
    await asyncio.sleep(1.1 - elapsed)
    second = Runs("second")
    assert await other.execute({"id": 1}, second, timeout=5) == "second"
    assert slow.starts == 1 and second.starts == 1


@on_stores("memory", "postgres", "redis")
async def test_without_deadline_or_lease_the_ttl_bounds_the_callback(store: Store) -> None:
    manager = make(store, expires_after=1.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute({"id": 1}, Runs(sleep=30))
    assert loop.time() - started < 1.0


# -- 2. only the callback runs under the cutoff ----------------------------------------


@on_stores("memory", "dynamodb", "redis")
async def test_slow_release_after_a_failure_keeps_the_callers_exception(store: Store) -> None:
    # The callback fails before its cutoff; the release outlasts the cutoff.
    # timeout 2 s: cutoff at 1.6 s, lease end at 2 s; the release runs from 0.9 s to 1.62 s
    # (plus the claim's and the release's round trips: up to 0.38 s on a slow machine).
    recording = RecordingStore(store, delay={"release": 0.72})
    manager = make(recording)
    failing = Runs(sleep=0.9, error=ValueError("card declined"))
    with pytest.raises(ValueError, match="card declined") as caught:
        await manager.execute({"id": 1}, failing, timeout=2.0)
    assert not getattr(caught.value, "__notes__", None)  # the release succeeded
    assert await record_of(store, manager.key_for({"id": 1})) is None


@on_stores("memory", "postgres", "redis")
async def test_release_past_the_lease_end_is_abandoned_with_a_note(store: Store) -> None:
    recording = RecordingStore(store, delay={"release": 5})
    manager = make(recording)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ValueError, match="declined") as caught:
        await manager.execute({"id": 1}, Runs(error=ValueError("declined")), timeout=0.5)
    assert loop.time() - started < 1.5
    assert any("abandoned at the lease end" in note for note in caught.value.__notes__)


@on_stores("memory", "dynamodb", "redis")
async def test_a_failure_inside_a_task_group_reaches_the_group(store: Store) -> None:
    recording = RecordingStore(store, delay={"release": 0.6})
    manager = make(recording)
    with pytest.raises(ExceptionGroup) as caught:
        async with asyncio.TaskGroup() as group:
            group.create_task(
                manager.execute({"id": 1}, Runs(sleep=1.2, error=KeyError("x")), timeout=2.0)
            )
    assert caught.value.subgroup(KeyError) is not None


# -- 3. a claim sent again after its answer was lost meets itself -----------------------


async def test_a_resent_claim_recognises_its_own_record(store: Store) -> None:
    recording = RecordingStore(store, resend={"claim"})
    manager = make(recording)
    work = Runs("once")
    assert await manager.execute({"id": 1}, work, timeout=5) == "once"
    assert work.starts == 1
    record = await record_of(store, manager.key_for({"id": 1}))
    assert record is not None and record.status is Status.COMPLETED


async def test_a_claim_with_an_unknown_outcome_is_released_before_the_error(
    store: Store,
) -> None:
    recording = RecordingStore(store, lose_answer={"claim"})
    manager = make(recording)
    work = Runs()
    with pytest.raises(errors.StoreUnavailableError):
        await manager.execute({"id": 1}, work, timeout=60)
    assert work.starts == 0
    assert recording.calls == ["claim", "release"]
    # The key is not blocked for the 60 s lease by a claim nobody holds.
    retry = make(store)
    assert await retry.execute({"id": 1}, Runs("retried"), timeout=5) == "retried"


async def test_wait_does_not_wait_on_its_own_resent_claim(store: Store) -> None:
    recording = RecordingStore(store, resend={"claim"})
    manager = make(recording, wait=Wait(timeout=30))
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await manager.execute({"id": 1}, Runs("fast"), timeout=60) == "fast"
    assert loop.time() - started < 1


# -- 4. in-process duplicates wait for the claim's answer -------------------------------


async def test_concurrent_duplicates_of_a_completed_key_all_replay(store: Store) -> None:
    await make(store).execute({"id": 1}, Runs({"order": 1}), timeout=5)
    slow = RecordingStore(store, delay={"claim": 0.1})
    manager = make(slow)
    work = Runs("must not run")
    results = await asyncio.gather(
        *(manager.execute({"id": 1}, work, timeout=5) for _ in range(10)),
        return_exceptions=True,
    )
    assert results == [{"order": 1}] * 10
    assert work.starts == 0
    assert slow.calls == ["claim"]  # duplicates replayed the first claim's answer


async def test_bogus_reuse_in_flight_does_not_fail_a_genuine_retry(store: Store) -> None:
    options = {"event_key_jmespath": "id", "payload_validation_jmespath": "amount"}
    await make(store, **options).execute({"id": 1, "amount": 10}, Runs("paid"), timeout=5)
    manager = make(RecordingStore(store, delay={"claim": 0.1}), **options)
    bogus = asyncio.create_task(manager.execute({"id": 1, "amount": 99}, Runs(), timeout=5))
    await asyncio.sleep(0.01)  # the bogus call's claim is unanswered
    genuine = await manager.execute({"id": 1, "amount": 10}, Runs(), timeout=5)
    assert genuine == "paid"
    with pytest.raises(errors.PayloadValidationError):
        await bogus


async def test_a_duplicate_replaying_an_unanswered_claims_result_is_validated(
    store: Store,
) -> None:
    options = {"event_key_jmespath": "id", "payload_validation_jmespath": "amount"}
    await make(store, **options).execute({"id": 1, "amount": 10}, Runs("paid"), timeout=5)
    manager = make(RecordingStore(store, delay={"claim": 0.1}), **options)
    genuine = asyncio.create_task(manager.execute({"id": 1, "amount": 10}, Runs(), timeout=5))
    await asyncio.sleep(0.01)
    with pytest.raises(errors.PayloadValidationError):
        await manager.execute({"id": 1, "amount": 99}, Runs(), timeout=5)
    assert await genuine == "paid"


async def test_duplicate_of_a_confirmed_holder_is_rejected_without_a_store_call(
    store: Store,
) -> None:
    recording = RecordingStore(store)
    manager = make(recording)
    holder = await start_holding(manager, {"id": 1}, seconds=0.3, result="r")
    calls = len(recording.calls)
    with pytest.raises(errors.AlreadyInProgressError) as caught:
        await manager.execute({"id": 1}, Runs(), timeout=5)
    assert len(recording.calls) == calls
    assert caught.value.retry_after is not None and 0 < caught.value.retry_after <= 5
    assert await holder == "r"


# -- 5. timeout= bounds calls without a key --------------------------------------------


async def test_timeout_bounds_a_call_without_a_key(store: Store) -> None:
    manager = make(store, event_key_jmespath="id")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute({"no-id": 1}, Runs(sleep=30), timeout=0.2)
    assert loop.time() - started < 1


async def test_timeout_bounds_a_call_when_idempotency_is_disabled(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POWERTOOLS_IDEMPOTENCY_DISABLED", "1")
    manager = make(store)
    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute({"id": 1}, Runs(sleep=30), timeout=0.2)


# -- 6. sub-second expires_after --------------------------------------------------------


async def test_sub_second_expiry_is_not_born_expired(store: Store) -> None:
    clock = Clock(1_700_000_000.2)
    manager = make(store, expires_after=0.5, clock=clock)
    work = Runs("once")
    await manager.execute({"id": 1}, work, timeout=5)
    clock.advance(0.1)
    assert (
        await make(store, expires_after=0.5, clock=clock).execute({"id": 1}, work, timeout=5)
        == "once"
    )
    assert work.starts == 1


# -- 7. one key, one answer ------------------------------------------------------------


async def test_a_response_the_store_cannot_keep_gives_one_answer_everywhere(
    store: Store,
) -> None:
    events: list[Event] = []
    local = make(store, local_cache=LocalCache(), on_event=events.append)
    if isinstance(store, MemoryStore):
        big = "x" * (store.max_response_bytes + 1)
    else:  # under max_response_bytes, but no DynamoDB item holds it even compressed
        big = base64.b64encode(os.urandom(450_000)).decode()
    assert await local.execute({"id": 1}, Runs(big), timeout=30) == big
    assert "response_not_stored" in [event.kind for event in events]
    with pytest.raises(errors.ResponseNotStoredError):
        await local.execute({"id": 1}, Runs(), timeout=5)
    with pytest.raises(errors.ResponseNotStoredError, match="too large"):
        await make(store).execute({"id": 1}, Runs(), timeout=5)


# -- 8. the completion write is bounded at the lease end --------------------------------


@on_stores("memory", "postgres", "redis")
async def test_a_completion_slower_than_the_lease_is_abandoned_as_unknown(store: Store) -> None:
    recording = RecordingStore(store, delay={"complete": 30})
    manager = make(recording)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(errors.CompletionError) as caught:
        await manager.execute({"id": 1}, Runs("charged"), timeout=0.5)
    assert loop.time() - started < 1.0
    assert caught.value.outcome_unknown is True
    assert caught.value.result == "charged"
    assert "unknown" in str(caught.value)


@on_stores("memory", "postgres", "redis")
async def test_completion_reserve_is_configurable(store: Store) -> None:
    # timeout 2 s: the default reserve (0.4 s) would cut off at 1.6 s, this one at 0.8 s.
    manager = make(store, completion_reserve=1.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute({"id": 1}, Runs(sleep=5), timeout=2.0)
    assert 0.7 < loop.time() - started < 1.4


# -- 9. only a confirmed claim runs the callback ----------------------------------------


async def test_an_unrecognised_claim_answer_does_not_run_the_callback(store: Store) -> None:
    class Confused(RecordingStore):
        async def claim(self, claim: Any) -> Any:
            await self.inner.claim(claim)
            return None  # the version-1 answer for "claimed"

    manager = make(Confused(store))
    work = Runs()
    with pytest.raises(errors.StoreUnavailableError, match="not a verdict"):
        await manager.execute({"id": 1}, work, timeout=5)
    assert work.starts == 0


# -- DynamoDB: the same faults on the wire ----------------------------------------------


@pytest.fixture
async def proxied(dynamodb_client: Any, moto_endpoint: str) -> AsyncIterator[tuple[Any, _Proxy]]:
    store = await fresh_store(dynamodb_client)
    proxy = _Proxy(moto_endpoint)
    await proxy.start()
    config = AioConfig(
        retries={"mode": "standard", "total_max_attempts": 3},
        connect_timeout=1,
        read_timeout=2,
    )
    async with new_session().client("dynamodb", endpoint_url=proxy.url, config=config) as client:
        yield DynamoDBStore(client, table_name=store.table_name), proxy
    await proxy.aclose()


@pytest.mark.dynamodb
async def test_dynamodb_claim_retried_by_the_sdk_after_a_lost_answer_runs_once(
    proxied: tuple[DynamoDBStore, _Proxy],
) -> None:
    store, proxy = proxied
    manager = make(store)
    proxy.lose_answers = 1  # the PutItem applies; botocore sends it again
    work = Runs("once")
    assert await manager.execute({"id": 1}, work, timeout=10) == "once"
    assert work.starts == 1
    assert await make(store).execute({"id": 1}, Runs("twice"), timeout=10) == "once"


@pytest.mark.dynamodb
async def test_dynamodb_claim_lost_after_every_retry_is_released(
    proxied: tuple[DynamoDBStore, _Proxy], dynamodb_client: Any
) -> None:
    store, proxy = proxied
    manager = make(store)
    proxy.lose_answers = 3  # every attempt of the claim applies and loses its answer
    work = Runs()
    with pytest.raises(errors.StoreUnavailableError):
        await manager.execute({"id": 1}, work, timeout=60)
    assert work.starts == 0
    direct = DynamoDBStore(dynamodb_client, table_name=store.table_name)
    assert (await direct.get(manager.key_for({"id": 1}) or "", now=time.time())).record is None


@pytest.mark.dynamodb
async def test_dynamodb_endpoint_that_is_not_dynamodb_does_not_run_the_callback() -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})  # 200, but not DynamoDB's answer

    app = web.Application()
    app.router.add_post("/", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with new_session().client(
            "dynamodb", endpoint_url=f"http://127.0.0.1:{port}"
        ) as client:
            manager = make(DynamoDBStore(client, table_name="t"))
            work = Runs()
            with pytest.raises(errors.StoreUnavailableError, match="confirmation"):
                await manager.execute({"id": 1}, work, timeout=5)
            assert work.starts == 0
    finally:
        await runner.cleanup()


# -- the error model -------------------------------------------------------------------


def test_error_model() -> None:
    assert issubclass(errors.KeyMissingError, errors.PayloadError)
    assert not issubclass(errors.PayloadValidationError, errors.PayloadError)
    assert issubclass(errors.DeadlineExceededError, errors.IdempotencyError)
    assert issubclass(errors.DeadlineExceededError, TimeoutError)


async def test_force_release_returns_what_it_deleted(store: Store) -> None:
    manager = make(store)
    await manager.execute({"id": 1}, Runs("r"), timeout=5)
    key = manager.key_for({"id": 1}) or ""
    deleted = await manager.force_release(key)
    assert deleted is not None and deleted.response == "r"
    assert await manager.force_release(key) is None


async def test_in_progress_rejection_reports_seconds(store: Store) -> None:
    clock = Clock()
    holder_manager = make(store, clock=clock)
    release = asyncio.Event()
    holder = await start_holding(holder_manager, {"id": 1}, until=release, timeout=20)
    with pytest.raises(errors.AlreadyInProgressError) as caught:
        await make(store, clock=clock).execute({"id": 1}, Runs(), timeout=5)
    assert caught.value.retry_after is not None and 19 < caught.value.retry_after <= 20.01
    assert caught.value.lease_end is not None
    assert abs(caught.value.lease_end - (clock.now + caught.value.retry_after)) < 0.01
    release.set()
    await holder


# -- found by the fault simulator ------------------------------------------------------


@on_stores("memory", "postgres", "redis")
async def test_a_claim_answered_after_the_cutoff_does_not_start_the_callback(
    store: Store,
) -> None:
    # The store took longer than the whole lease to answer the claim: by then another
    # worker may hold the key, so the callback must not start at all.
    events: list[Event] = []
    manager = make(RecordingStore(store, delay={"claim": 1.0}), on_event=events.append)
    work = Runs()
    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute({"id": 1}, work, timeout=0.5)
    assert work.starts == 0
    assert [event.kind for event in events] == ["claimed", "cut_off"]


@on_stores("memory", "postgres", "redis")
async def test_execute_call_does_not_start_a_callback_claimed_after_the_cutoff(
    store: Store,
) -> None:
    events: list[Event] = []
    manager = make(RecordingStore(store, delay={"claim": 1.0}), on_event=events.append)
    starts = 0

    async def work(call: Any) -> str:
        nonlocal starts
        starts += 1
        return "ran"

    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute_call({"id": 1}, work, timeout=0.5)
    assert starts == 0
    assert [event.kind for event in events] == ["claimed", "cut_off"]


class _FirstClaimStalls(RecordingStore):
    """The first claim takes 30 s to answer; later ones answer at once."""

    async def claim(self, claim: Any) -> Any:
        if not self.claims:
            self.claims.append(claim)
            await asyncio.sleep(30)
        return await self.inner.claim(claim)


async def test_a_duplicate_stops_waiting_for_an_unanswered_claim_and_asks_the_store(
    store: Store,
) -> None:
    await make(store).execute({"id": 1}, Runs("paid"), timeout=5)
    manager = make(_FirstClaimStalls(store), wait=Wait(timeout=0.2))
    stalled = asyncio.create_task(manager.execute({"id": 1}, Runs(), timeout=60))
    await asyncio.sleep(0.05)  # its claim is unanswered
    # Completed key: the duplicate must replay, not report "in progress" after waiting.
    assert await manager.execute({"id": 1}, Runs(), timeout=5) == "paid"
    stalled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stalled


async def test_an_execute_call_duplicate_stops_waiting_for_an_unanswered_claim(
    store: Store,
) -> None:
    await make(store).execute({"id": 1}, Runs("paid"), timeout=5)
    manager = make(_FirstClaimStalls(store), wait=Wait(timeout=0.2))
    stalled = asyncio.create_task(manager.execute_call({"id": 1}, _ignore_call, timeout=60))
    await asyncio.sleep(0.05)  # its claim is unanswered
    assert await manager.execute_call({"id": 1}, _ignore_call, timeout=5) == "paid"
    stalled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stalled


async def _ignore_call(call: Any) -> str:
    return "must not run"


async def test_a_completion_answered_with_nonsense_is_an_unknown_outcome(store: Store) -> None:
    class Confused(RecordingStore):
        async def complete(self, completion: Any) -> Any:
            await self.inner.complete(completion)
            return "OK"

    manager = make(Confused(store))
    with pytest.raises(errors.CompletionError) as caught:
        await manager.execute({"id": 1}, Runs("charged"), timeout=5)
    assert caught.value.outcome_unknown is True
    assert caught.value.result == "charged"

    async def completes_early(call: Any) -> str:
        await call.complete("charged")
        return "charged"

    with pytest.raises(errors.CompletionError) as caught:
        await manager.execute_call({"id": 2}, completes_early, timeout=5)
    assert caught.value.outcome_unknown is True


# -- issue 21, defect 1: a plain function passed as the callback -------------------------


class Plain:
    """A plain (sync) function: its side effect happens when it is called."""

    def __init__(self, result: Any = "charged") -> None:
        self.runs = 0
        self.result = result

    def __call__(self, *call: Any) -> Any:
        self.runs += 1
        return self.result


async def test_a_plain_function_runs_once_and_completes_without_a_response(
    store: Store,
) -> None:
    recording = RecordingStore(store)
    manager = make(recording)
    charge = Plain({"charged": True})
    with pytest.raises(errors.ConfigError, match="not an awaitable") as caught:
        await manager.execute({"id": 1}, charge, timeout=5)
    assert not isinstance(caught.value.__cause__, TypeError)
    assert "release" not in recording.calls  # it ran: the key is never released
    record = await record_of(store, manager.key_for({"id": 1}))
    assert record is not None and record.status is Status.COMPLETED
    assert not record.response_stored and record.not_stored is not None
    # Retries, here and in other processes, replay "not stored" instead of running it again.
    with pytest.raises(errors.ResponseNotStoredError, match="not an awaitable"):
        await manager.execute({"id": 1}, charge, timeout=5)
    with pytest.raises(errors.ResponseNotStoredError):
        await make(store).execute({"id": 1}, charge)
    assert charge.runs == 1


async def test_a_plain_function_given_to_execute_call_runs_once(store: Store) -> None:
    manager = make(store)
    charge = Plain()
    with pytest.raises(errors.ConfigError, match="not an awaitable"):
        await manager.execute_call({"id": 1}, charge, timeout=5)
    with pytest.raises(errors.ResponseNotStoredError):
        await manager.execute_call({"id": 1}, charge, timeout=5)
    with pytest.raises(errors.ResponseNotStoredError):
        await make(store).execute({"id": 1}, charge, timeout=5)
    assert charge.runs == 1


async def test_a_plain_function_without_a_key_is_a_config_error(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording, event_key_jmespath="id")
    charge = Plain()
    with pytest.raises(errors.ConfigError, match="not an awaitable"):
        await manager.execute({"no-id": 1}, charge)
    with pytest.raises(errors.ConfigError, match="not an awaitable"):
        await manager.execute({"no-id": 1}, charge, timeout=5)
    with pytest.raises(errors.ConfigError, match="not an awaitable"):
        await manager.execute_call({"no-id": 1}, charge, timeout=5)
    assert charge.runs == 3 and recording.calls == []


async def test_a_lambda_returning_an_awaitable_still_works(store: Store) -> None:
    manager = make(store)
    loop = asyncio.get_running_loop()

    def ready() -> asyncio.Future[str]:
        future: asyncio.Future[str] = loop.create_future()
        future.set_result("from a future")
        return future

    assert await manager.execute({"id": 1}, ready, timeout=5) == "from a future"
    assert await make(store).execute({"id": 1}, Plain(), timeout=5) == "from a future"


# -- issue 21, defect 2: a BaseException that is not an Exception -----------------------


class _Abort(BaseException):
    """What sys.exit or a test framework's fail() raises: not an Exception."""


async def _aborts(*call: Any) -> Any:
    raise _Abort


@on_stores("memory", "dynamodb", "redis")
async def test_a_base_exception_is_a_crash_and_leaves_no_cutoff_armed(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording)
    with pytest.raises(_Abort):
        await manager.execute({"id": 1}, _aborts, timeout=0.5)
    # Past the cutoff (0.4 s): on the landed code it cancelled this task here.
    await asyncio.sleep(0.6)
    with pytest.raises(_Abort):
        await manager.execute_call({"id": 2}, _aborts, timeout=0.5)
    await asyncio.sleep(0.6)
    assert recording.calls == ["claim", "claim"]  # no store write after the claims
    for n in (1, 2):
        record = await record_of(store, manager.key_for({"id": n}))
        assert record is not None and record.status is Status.INPROGRESS  # waits for its lease


async def test_a_base_exception_without_a_key_leaves_no_cutoff_armed(store: Store) -> None:
    manager = make(store, event_key_jmespath="id")
    with pytest.raises(_Abort):
        await manager.execute({"no-id": 1}, _aborts, timeout=0.3)
    with pytest.raises(_Abort):
        await manager.execute_call({"no-id": 1}, _aborts, timeout=0.3)
    await asyncio.sleep(0.5)


# -- issue 21, defect 4: a claim whose outcome stays unknown is released -----------------


class _ClaimAppliesThenFails(RecordingStore):
    """The claim applies; its answer is lost and the SDK's retry fails with ``answer``
    (an exception to raise, or a nonsense object to return)."""

    answer: Any = None

    async def claim(self, claim: Any) -> Any:
        self.calls.append("claim")
        await self.inner.claim(claim)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    "answer",
    [
        errors.StoreThrottledError("throttled after a lost answer (injected)"),
        errors.PersistenceError("an answer the SDK could not parse (injected)"),
        RuntimeError("a driver bug (injected)"),
        "OK",  # an answer that is not a verdict
    ],
    ids=["throttled", "persistence", "driver", "nonsense"],
)
async def test_a_claim_with_an_unknown_outcome_is_released_whatever_the_failure(
    store: Store, answer: Any
) -> None:
    faulty = _ClaimAppliesThenFails(store)
    faulty.answer = answer
    manager = make(faulty)
    work = Runs()
    raised = type(answer) if isinstance(answer, BaseException) else errors.StoreUnavailableError
    with pytest.raises(raised):
        await manager.execute({"id": 1}, work, timeout=60)
    assert work.starts == 0
    assert faulty.calls == ["claim", "release"]
    # The key is not blocked for the 60 s lease by a claim nobody holds.
    assert await record_of(store, manager.key_for({"id": 1})) is None
    with pytest.raises(raised):
        await manager.execute_call({"id": 2}, _ignore_call, timeout=60)
    assert faulty.calls[-2:] == ["claim", "release"]
    assert await record_of(store, manager.key_for({"id": 2})) is None


async def test_a_refused_claim_is_not_released(store: Store) -> None:
    refused = RecordingStore(
        store, fail_on={"claim": errors.StoreAccessDeniedError("denied (injected)")}
    )
    manager = make(refused)
    with pytest.raises(errors.StoreAccessDeniedError):
        await manager.execute({"id": 1}, Runs(), timeout=60)
    assert refused.calls == ["claim"]


# -- issue 21, defect 7: force_release and replays that ran meanwhile --------------------


async def test_force_release_leaves_no_cache_entry_after_a_replay_during_the_release(
    store: Store,
) -> None:
    slow = RecordingStore(store, delay={"force_release": 0.3})
    manager = make(slow, local_cache=LocalCache())
    await manager.execute({"id": 1}, Runs("first"), timeout=5)
    key = manager.key_for({"id": 1}) or ""
    releasing = asyncio.create_task(manager.force_release(key))
    await asyncio.sleep(0.05)
    # The record is still in the store: this replays it while the release is under way.
    assert await manager.execute({"id": 1}, Runs(), timeout=5) == "first"
    assert await releasing is not None
    second = Runs("second")
    assert await manager.execute({"id": 1}, second, timeout=5) == "second"
    assert second.starts == 1


class _ClaimAnswersLate(RecordingStore):
    """Claims apply at once; their answers arrive ``late`` seconds later."""

    late = 0.3

    async def claim(self, claim: Any) -> Any:
        verdict = await self.inner.claim(claim)
        await asyncio.sleep(self.late)
        return verdict


async def test_force_release_leaves_no_cache_entry_after_a_replay_answered_later(
    store: Store,
) -> None:
    await make(store).execute({"id": 1}, Runs("first"), timeout=5)
    manager = make(_ClaimAnswersLate(store), local_cache=LocalCache())
    key = manager.key_for({"id": 1}) or ""
    replay = asyncio.create_task(manager.execute({"id": 1}, Runs(), timeout=5))
    await asyncio.sleep(0.05)  # the claim met the completed record; its answer is late
    assert await manager.force_release(key) is not None
    assert await replay == "first"  # answered after the release finished
    second = Runs("second")
    assert await manager.execute({"id": 1}, second, timeout=5) == "second"
    assert second.starts == 1


# -- issue 21, defect 8: deadlines, timeouts and leases are finite positive numbers -------


_NOT_DURATIONS = [math.inf, -math.inf, math.nan, 0, -1.0, True, "5"]
_NOT_INSTANTS = [math.inf, -math.inf, math.nan, "5"]


@pytest.mark.parametrize("timeout", _NOT_DURATIONS, ids=repr)
async def test_a_timeout_that_is_not_finite_and_positive_is_a_config_error(
    timeout: Any,
) -> None:
    recording = RecordingStore(MemoryStore())
    manager = make(recording)
    work = Runs()
    with pytest.raises(errors.ConfigError, match="timeout must be a finite positive"):
        await manager.execute({"id": 1}, work, timeout=timeout)
    with pytest.raises(errors.ConfigError, match="timeout must be a finite positive"):
        await manager.execute_call({"id": 1}, _ignore_call, timeout=timeout)
    with pytest.raises(errors.ConfigError, match="timeout"):
        idempotent_function(manager, payload="order", timeout=timeout)
    assert work.starts == 0 and recording.calls == []


@pytest.mark.parametrize("when", _NOT_INSTANTS, ids=repr)
async def test_a_deadline_that_is_not_finite_is_a_config_error(when: Any) -> None:
    recording = RecordingStore(MemoryStore())
    manager = make(recording)
    work = Runs()
    with pytest.raises(errors.ConfigError, match="deadline must be a finite"):
        await manager.execute({"id": 1}, work, deadline=when)
    with pytest.raises(errors.ConfigError, match="deadline must be a finite"):
        await manager.execute_call({"id": 1}, _ignore_call, deadline=when)
    with pytest.raises(errors.ConfigError, match="finite"):
        async with deadline(at=when):
            pass
    assert work.starts == 0 and recording.calls == []


@pytest.mark.parametrize("seconds", _NOT_DURATIONS, ids=repr)
async def test_an_ambient_deadline_that_is_not_finite_and_positive_is_a_config_error(
    seconds: Any,
) -> None:
    with pytest.raises(errors.ConfigError, match="finite positive"):
        async with deadline(seconds):
            pass


@pytest.mark.parametrize("millis", [math.inf, math.nan], ids=repr)
async def test_a_lambda_context_without_a_finite_remaining_time_is_a_config_error(
    millis: float,
) -> None:
    class Context:
        def get_remaining_time_in_millis(self) -> float:
            return millis

    work = Runs()

    @idempotent_handler(make(MemoryStore()))
    async def handler(event: Any, context: Any) -> Any:
        return await work()

    with pytest.raises(errors.ConfigError, match="finite"):
        await handler({"id": 1}, Context())
    assert work.starts == 0


async def test_finite_deadlines_still_work(store: Store) -> None:
    manager = make(store)
    loop = asyncio.get_running_loop()
    assert await manager.execute({"id": 1}, Runs("a"), timeout=5) == "a"
    assert await manager.execute({"id": 2}, Runs("b"), timeout=5.0) == "b"
    assert await manager.execute({"id": 3}, Runs("c"), deadline=loop.time() + 5) == "c"
    async with deadline(5):
        assert await manager.execute({"id": 4}, Runs("d")) == "d"


# -- issue 21, defect 5: the local cache by the store's clock ----------------------------


@pytest.mark.redis
async def test_the_local_cache_keeps_a_server_clock_record_as_long_as_the_server_says(
    redis_server: RedisServer,
) -> None:
    async with fresh_redis_store(redis_server) as store:  # judges by the server's TIME
        assert store.judged_by == "server"
        events: list[Event] = []
        behind = make(
            store,
            local_cache=LocalCache(),
            on_event=events.append,
            clock=lambda: time.time() - 120,  # two minutes behind the server
        )
        writer = make(store, expires_after=1)
        assert await writer.execute({"id": 1}, Runs("first"), timeout=5) == "first"
        # The worker behind replays the record and caches it, then hits its cache.
        assert await behind.execute({"id": 1}, Runs(), timeout=5) == "first"
        assert await behind.execute({"id": 1}, Runs(), timeout=5) == "first"
        assert events[-1].kind == "cache_hit"
        # The record expires in Redis within ~2 s (whole seconds); another worker replaces it.
        second = Runs("second")
        other = make(store, expires_after=60)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 10
        while second.starts == 0 and loop.time() < give_up:
            await asyncio.sleep(0.2)
            assert await other.execute({"id": 1}, second, timeout=5) in ("first", "second")
        assert second.starts == 1
        # The worker behind replays what the store holds now, not its stale entry (by its
        # own clock the replaced record had two more minutes to live).
        assert await behind.execute({"id": 1}, Runs(), timeout=5) == "second"
        assert await behind.execute({"id": 1}, Runs(), timeout=5) == "second"
        assert events[-1].kind == "cache_hit"


@on_stores("memory", "postgres", "redis")
async def test_the_local_cache_counts_a_replayed_records_life_from_the_request(
    store: Store,
) -> None:
    # The record was completed 2 s of its 3 s ago (by the writer's clock, which the
    # client-clock stores use): a replay may be cached for what is left, no longer.
    clock = Clock(float(int(time.time())))  # a whole second: expiry is ceil(now + ttl)
    await make(store, expires_after=3, clock=clock).execute({"id": 1}, Runs("first"))
    clock.advance(2)
    recording = RecordingStore(store)
    cached = make(recording, local_cache=LocalCache(), clock=clock)
    assert await cached.execute({"id": 1}, Runs(), timeout=5) == "first"
    claims = recording.calls.count("claim")
    assert await cached.execute({"id": 1}, Runs(), timeout=5) == "first"
    assert recording.calls.count("claim") == claims  # a cache hit
    await asyncio.sleep(1.1)  # past the 1 s the store said was left
    clock.advance(3)
    assert await cached.execute({"id": 1}, Runs("second"), timeout=5) == "second"


async def test_a_plain_function_runs_once_with_telemetry_on(store: Store) -> None:
    # Telemetry's timing wrapper awaits the callback itself: the check comes first.
    from opentelemetry.sdk.trace import TracerProvider

    from idempotency_async.otel import Telemetry

    manager = make(store, telemetry=Telemetry(tracer_provider=TracerProvider()))
    charge = Plain()
    with pytest.raises(errors.ConfigError, match="not an awaitable"):
        await manager.execute({"id": 1}, charge, timeout=5)
    with pytest.raises(errors.ConfigError, match="not an awaitable"):
        await manager.execute_call({"id": 2}, charge, timeout=5)
    with pytest.raises(errors.ResponseNotStoredError):
        await manager.execute({"id": 1}, charge, timeout=5)
    with pytest.raises(errors.ResponseNotStoredError):
        await manager.execute_call({"id": 2}, charge, timeout=5)
    assert charge.runs == 2


async def test_a_nested_call_given_a_plain_function_is_the_outer_callbacks_failure(
    store: Store,
) -> None:
    inner = make(store, event_key_jmespath="id", key_prefix="inner")
    outer = make(store)
    charge = Plain()

    async def work() -> Any:
        return await inner.execute({"no-id": 1}, charge)

    for _ in range(2):
        with pytest.raises(errors.ConfigError, match="not an awaitable"):
            await outer.execute({"id": 1}, work, timeout=5)
    # The outer callback raised: its key was released and the retry ran it again.
    assert charge.runs == 2
    assert await record_of(store, outer.key_for({"id": 1})) is None


class _ThrottlingProxy(_Proxy):
    """``_Proxy``, answering the next ``throttled`` connections (once no answer is left to
    lose) with DynamoDB's ThrottlingException."""

    throttled = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.throttled > 0 and self.lose_answers == 0:
            self.throttled -= 1
            await _answer_with_error("ThrottlingException", reader, writer)
            return
        await super()._handle(reader, writer)


@pytest.mark.dynamodb
async def test_dynamodb_claim_throttled_after_a_lost_answer_is_released(
    dynamodb_client: Any, moto_endpoint: str
) -> None:
    table = await fresh_store(dynamodb_client)
    proxy = _ThrottlingProxy(moto_endpoint)
    await proxy.start()
    config = AioConfig(
        retries={"mode": "standard", "total_max_attempts": 3},
        connect_timeout=1,
        read_timeout=2,
    )
    try:
        async with new_session().client(
            "dynamodb", endpoint_url=proxy.url, config=config
        ) as client:
            store = DynamoDBStore(client, table_name=table.table_name)
            manager = make(store)
            # The PutItem applies and its answer is lost; botocore's retries are throttled.
            proxy.lose_answers = 1
            proxy.throttled = 2
            work = Runs()
            with pytest.raises(errors.StoreThrottledError):
                await manager.execute({"id": 1}, work, timeout=60)
            assert work.starts == 0 and proxy.throttled == 0
            # Released: not blocked for the 60 s lease by a claim nobody holds.
            assert (
                await table.get(manager.key_for({"id": 1}) or "", now=time.time())
            ).record is None
            retried = Runs("retried")
            assert await make(table).execute({"id": 1}, retried, timeout=5) == "retried"
    finally:
        await proxy.aclose()


async def test_a_replay_without_a_remaining_life_is_not_cached(store: Store) -> None:
    class Lifeless(RecordingStore):
        async def claim(self, claim: Any) -> Any:
            verdict = await super().claim(claim)
            return (
                verdict
                if verdict.found is not Found.COMPLETED
                else verdict._replace(expires_in=None)
            )

    await make(store).execute({"id": 1}, Runs("first"), timeout=5)
    lifeless = Lifeless(store)
    manager = make(lifeless, local_cache=LocalCache())
    for _ in range(2):
        assert await manager.execute({"id": 1}, Runs(), timeout=5) == "first"
    assert lifeless.calls == ["claim", "claim"]  # never judged by this process's clock


@pytest.mark.parametrize("option", ["lease", "expires_after", "lease_margin", "completion_reserve"])
@pytest.mark.parametrize("value", [math.inf, math.nan, -math.inf], ids=repr)
def test_a_lease_or_duration_option_that_is_not_finite_is_a_config_error(
    option: str, value: float
) -> None:
    with pytest.raises(errors.ConfigError, match=option):
        Options(**{option: value})


@pytest.mark.parametrize(
    ("group", "field"), [(Wait, "timeout"), (Renewal, "lease"), (Renewal, "every")]
)
@pytest.mark.parametrize("value", [math.inf, math.nan, -math.inf], ids=repr)
def test_a_duration_in_an_option_group_that_is_not_finite_is_a_config_error(
    group: Any, field: str, value: float
) -> None:
    settings = {"lease": 30.0} if group is Renewal else {}
    with pytest.raises(errors.ConfigError, match=rf"{group.__name__}\({field}="):
        group(**{**settings, field: value})


# -- cancellation: the caller's, or the callback's own (a review of the merged lifecycle) ---


async def test_a_cancelled_error_the_callback_raises_itself_is_its_own_and_releases(
    store: Store,
) -> None:
    # Nobody cancelled the caller: the CancelledError is the callback's own exception (G5),
    # and the key is released like after any failure, not blocked for the whole lease.
    async def cancels_itself() -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.cancel()
        await future

    manager = make(store)
    payload = {"id": "own-cancel"}
    with pytest.raises(asyncio.CancelledError):
        await manager.execute(payload, cancels_itself, timeout=30)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    assert await record_of(store, manager.key_for(payload)) is None
    assert await manager.execute(payload, Runs("again"), timeout=30) == "again"


async def test_a_cancelled_error_the_call_callback_raises_itself_releases_too() -> None:
    async def cancels_itself(call: Any) -> None:
        raise asyncio.CancelledError

    store = MemoryStore()
    manager = make(store)
    payload = {"id": "own-cancel-call"}
    with pytest.raises(asyncio.CancelledError):
        await manager.execute_call(payload, cancels_itself, timeout=30)
    assert await record_of(store, manager.key_for(payload)) is None


@pytest.mark.parametrize("swallow", ["into-another-exception", "and-return"])
async def test_a_cancelled_caller_gets_cancelled_error_and_no_store_write(swallow: str) -> None:
    # The callback turns its caller's cancellation into another exception, or swallows it
    # and returns: the caller was cancelled, so it gets CancelledError and nothing is
    # written after the cancellation (G6) — the record waits for its lease.
    store = RecordingStore(MemoryStore())
    manager = make(store)
    started = asyncio.Event()

    async def swallows() -> str:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if swallow == "into-another-exception":
                raise RuntimeError("converted") from None
        return "swallowed"

    task = asyncio.create_task(manager.execute({"id": swallow}, swallows, timeout=30))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.calls == ["claim"]
    record = await record_of(store, manager.key_for({"id": swallow}))
    assert record is not None and record.status is Status.INPROGRESS


async def test_a_completion_failing_with_a_throttle_has_an_unknown_outcome() -> None:
    # Anything but a definite refusal may hide a write that applied: here it did.
    inner = MemoryStore()

    class ThrottledAfterApplying(RecordingStore):
        async def complete(self, completion: Any) -> Any:
            await self.inner.complete(completion)
            raise errors.StoreThrottledError("throttled on the SDK's retry")

    manager = make(ThrottledAfterApplying(inner))
    with pytest.raises(errors.CompletionError) as caught:
        await manager.execute({"id": "throttled"}, Runs("done"), timeout=30)
    assert caught.value.outcome_unknown is True
    record = await record_of(inner, manager.key_for({"id": "throttled"}))
    assert record is not None and record.status is Status.COMPLETED


async def test_call_stored_says_what_the_store_kept() -> None:
    # A store that keeps the record without the response it was sent (a value it cannot
    # hold): the call may still attach another answer later, so it is not "stored".
    store = MemoryStore()

    class CannotHold(RecordingStore):
        async def complete(self, completion: Any) -> Any:
            if completion.encoded is not None:
                completion = completion._replace(
                    encoded=None, response=None, not_stored="cannot hold it"
                )
            return await self.inner.complete(completion)

    manager = make(CannotHold(store))

    async def answers(call: Any) -> None:
        await call.complete({"big": "x" * 100})
        assert call.stored is False
        await call.complete_without_response("replaced")

    await manager.execute_call({"id": "kept"}, answers, timeout=30)
    record = await record_of(store, manager.key_for({"id": "kept"}))
    assert record is not None and record.response_stored is False
