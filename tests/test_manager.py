"""The Manager's lifecycle, run against every store (the ``store`` fixture)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

import pytest
from support import Clock, RecordingStore, on_stores, record_of, start_holding

from idempotency_async import Event, LocalCache, Manager, MemoryStore, Options, Wait, errors
from idempotency_async.record import Status
from idempotency_async.stores.base import Found, Store, Verdict


def make(store: Store, clock: Clock | None = None, **options: Any) -> Manager:
    options.setdefault("key_prefix", "test")
    if clock is not None:
        options["clock"] = clock
    return Manager(store, Options(**options))


class Counter:
    """A callback that counts its runs and returns a chosen value."""

    def __init__(self, result: Any = "done", delay: float = 0.0) -> None:
        self.runs = 0
        self.result = result
        self.delay = delay

    async def __call__(self) -> Any:
        self.runs += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        return self.result


async def test_first_call_runs_and_duplicate_replays(store: Store) -> None:
    manager = make(store)
    work = Counter({"order": 7})
    assert await manager.execute({"id": 1}, work, timeout=5) == {"order": 7}
    assert await manager.execute({"id": 1}, work, timeout=5) == {"order": 7}
    assert work.runs == 1


@pytest.mark.parametrize("result", [0, "", [], {}, False, None, 0.0])
async def test_replay_returns_falsy_result_unchanged(store: Store, result: Any) -> None:
    manager = make(store)
    work = Counter(result)
    await manager.execute({"id": 1}, work, timeout=5)
    replayed = await manager.execute({"id": 1}, work, timeout=5)
    assert replayed == result and type(replayed) is type(result)
    assert work.runs == 1


async def test_replays_are_independent_copies(store: Store) -> None:
    manager = make(store, local_cache=LocalCache())
    await manager.execute({"id": 1}, Counter({"items": [1]}), timeout=5)
    first = await manager.execute({"id": 1}, Counter(), timeout=5)
    first["items"].append(2)
    assert await manager.execute({"id": 1}, Counter(), timeout=5) == {"items": [1]}


async def test_different_payloads_run_separately(store: Store) -> None:
    manager = make(store)
    work = Counter()
    await manager.execute({"id": 1}, work, timeout=5)
    await manager.execute({"id": 2}, work, timeout=5)
    assert work.runs == 2


async def test_validation_mismatch_on_completed_record_raises(store: Store) -> None:
    manager = make(store, event_key_jmespath="id", payload_validation_jmespath="amount")
    await manager.execute({"id": 1, "amount": 10}, Counter(), timeout=5)
    with pytest.raises(errors.PayloadValidationError, match="different payload"):
        await manager.execute({"id": 1, "amount": 11}, Counter(), timeout=5)


async def test_validation_mismatch_on_in_progress_record_raises_before_in_progress(
    store: Store,
) -> None:
    first = make(store, event_key_jmespath="id", payload_validation_jmespath="amount")
    second = make(store, event_key_jmespath="id", payload_validation_jmespath="amount")
    release = asyncio.Event()
    task = await start_holding(first, {"id": 1, "amount": 10}, until=release, result="ok")
    with pytest.raises(errors.PayloadValidationError):
        await second.execute({"id": 1, "amount": 99}, Counter(), timeout=5)
    with pytest.raises(errors.AlreadyInProgressError):
        await second.execute({"id": 1, "amount": 10}, Counter(), timeout=5)
    release.set()
    assert await task == "ok"


async def test_in_progress_error_carries_the_lease_end(store: Store, clock: Clock) -> None:
    first = make(store, clock)
    second = make(store, clock)
    release = asyncio.Event()
    task = await start_holding(first, {"id": 1}, until=release, result="ok", timeout=20)
    with pytest.raises(errors.AlreadyInProgressError) as info:
        await second.execute({"id": 1}, Counter(), timeout=5)
    assert info.value.lease_end is not None
    assert clock.now + 19 < info.value.lease_end <= clock.now + 20.001
    release.set()
    await task


async def test_callback_exception_releases_the_key_and_propagates(store: Store) -> None:
    manager = make(store)

    class PaymentDeclinedError(Exception):
        pass

    async def declined() -> None:
        raise PaymentDeclinedError("card declined")

    with pytest.raises(PaymentDeclinedError, match="card declined"):
        await manager.execute({"id": 1}, declined, timeout=5)
    assert await record_of(store, manager.key_for({"id": 1}) or "") is None
    work = Counter("retried")
    assert await manager.execute({"id": 1}, work, timeout=5) == "retried"
    assert work.runs == 1


async def test_failed_release_is_a_note_on_the_original_error(store: Store) -> None:
    recording = RecordingStore(store, fail_on={"release": errors.StoreUnavailableError("down")})
    events: list[Event] = []
    manager = make(recording, on_event=events.append)

    async def boom() -> None:
        raise KeyError("original")

    with pytest.raises(KeyError) as info:
        await manager.execute({"id": 1}, boom, timeout=5)
    assert any("releasing key" in note and "down" in note for note in info.value.__notes__)
    assert [e.kind for e in events if e.kind == "release_failed"] == ["release_failed"]


async def test_missing_key_runs_without_idempotency(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    recording = RecordingStore(store)
    manager = make(recording, event_key_jmespath="id")
    work = Counter()
    with caplog.at_level(logging.WARNING, "idempotency_async"):
        await manager.execute({"other": 1}, work)
        await manager.execute({"other": 1}, work)
    assert work.runs == 2
    assert recording.calls == []
    assert "no idempotency key" in caplog.text
    assert manager.key_for({"other": 1}) is None


@pytest.mark.parametrize("selected", [False, 0, "", [], {}])
async def test_falsy_selections_count_as_keys_by_default(store: Store, selected: Any) -> None:
    manager = make(store, event_key_jmespath="id")
    work = Counter()
    await manager.execute({"id": selected}, work, timeout=5)
    await manager.execute({"id": selected}, work, timeout=5)
    assert work.runs == 1


@pytest.mark.parametrize("selected", ["", [], {}])
async def test_strict_missing_key_treats_empty_selections_as_missing(
    store: Store, selected: Any
) -> None:
    manager = make(store, event_key_jmespath="id", strict_missing_key=True, raise_on_no_key=True)
    with pytest.raises(errors.KeyMissingError):
        await manager.execute({"id": selected}, Counter(), timeout=5)


async def test_raise_on_no_key_raises_before_any_store_call(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording, event_key_jmespath="id", raise_on_no_key=True)
    with pytest.raises(errors.KeyMissingError, match="no idempotency key"):
        await manager.execute({"id": None}, Counter(), timeout=5)
    assert recording.calls == []


async def test_invalid_payload_raises_before_any_store_call(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording)
    with pytest.raises(errors.PayloadError, match=r"\$\.items\[1\]"):
        await manager.execute({"items": [1, float("nan")]}, Counter(), timeout=5)
    assert recording.calls == []


async def test_integers_beyond_float64_precision_are_rejected_by_default(store: Store) -> None:
    manager = make(store)
    with pytest.raises(errors.PayloadError, match=r"2\*\*53|precision|float64"):
        await manager.execute({"id": 2**53 + 1}, Counter(), timeout=5)
    parity = make(store, integer_precision="float64")
    assert parity.key_for({"id": 2**53 + 1}) == parity.key_for({"id": 2**53})


async def test_unencodable_result_completes_as_not_stored(store: Store) -> None:
    manager = make(store)
    sentinel = object()
    work = Counter(sentinel)
    assert await manager.execute({"id": 1}, work, timeout=5) is sentinel
    with pytest.raises(errors.ResponseNotStoredError):
        await manager.execute({"id": 1}, work, timeout=5)
    assert work.runs == 1
    record = await record_of(store, manager.key_for({"id": 1}) or "")
    assert record is not None and record.status is Status.COMPLETED


async def test_oversized_result_completes_as_not_stored(store: Store) -> None:
    manager = make(store)
    big = "x" * (store.max_response_bytes + 10)
    work = Counter(big)
    assert await manager.execute({"id": 1}, work, timeout=5) == big
    with pytest.raises(errors.ResponseNotStoredError):
        await manager.execute({"id": 1}, work, timeout=5)
    assert work.runs == 1


async def test_completion_failure_carries_the_result(store: Store) -> None:
    recording = RecordingStore(store, fail_on={"complete": errors.StoreThrottledError("slow")})
    manager = make(recording)
    with pytest.raises(errors.CompletionError) as info:
        await manager.execute({"id": 1}, Counter({"charged": True}), timeout=5)
    assert info.value.result == {"charged": True}
    assert isinstance(info.value.__cause__, errors.StoreThrottledError)
    record = await record_of(store, manager.key_for({"id": 1}) or "")
    assert record is not None and record.status is Status.INPROGRESS


async def test_zombie_worker_gets_lease_lost_and_cannot_touch_new_owner(
    store: Store, clock: Clock
) -> None:
    worker_a = make(store, clock, lease=5)
    worker_b = make(store, clock, lease=5)
    a_started = asyncio.Event()
    a_may_finish = asyncio.Event()

    async def a_work() -> str:
        a_started.set()
        await a_may_finish.wait()
        return "a"

    task_a = asyncio.create_task(worker_a.execute({"id": 1}, a_work))
    await a_started.wait()
    clock.advance(6)  # A's lease lapses
    assert await worker_b.execute({"id": 1}, Counter("b")) == "b"
    a_may_finish.set()
    with pytest.raises(errors.LeaseLostError) as info:
        await task_a
    assert info.value.result == "a"
    record = await record_of(store, worker_b.key_for({"id": 1}) or "")
    assert record is not None and record.response == "b"


async def test_zombie_failure_does_not_delete_new_owners_record(store: Store, clock: Clock) -> None:
    worker_a = make(store, clock, lease=5)
    worker_b = make(store, clock, lease=5)
    a_started = asyncio.Event()
    a_may_fail = asyncio.Event()

    async def a_work() -> None:
        a_started.set()
        await a_may_fail.wait()
        raise RuntimeError("a failed late")

    task_a = asyncio.create_task(worker_a.execute({"id": 1}, a_work))
    await a_started.wait()
    clock.advance(6)
    assert await worker_b.execute({"id": 1}, Counter("b")) == "b"
    a_may_fail.set()
    with pytest.raises(RuntimeError):
        await task_a
    record = await record_of(store, worker_b.key_for({"id": 1}) or "")
    assert record is not None and record.status is Status.COMPLETED


async def test_record_that_stays_claimable_ends_in_inconsistent_state(store: Store) -> None:
    class StaleStore(RecordingStore):
        async def claim(self, claim: Any) -> Any:
            self.calls.append("claim")
            return Verdict(Found.CLAIMABLE)

    stale = StaleStore(store)
    manager = make(stale)
    with pytest.raises(errors.InconsistentStateError):
        await manager.execute({"id": 1}, Counter(), timeout=5)
    assert stale.calls == ["claim", "claim", "claim"]


@on_stores("memory", "dynamodb", "redis")
async def test_local_cache_replays_without_a_store_call(store: Store, clock: Clock) -> None:
    recording = RecordingStore(store)
    manager = make(recording, clock, local_cache=LocalCache(), expires_after=1)
    await manager.execute({"id": 1}, Counter("v"), timeout=5)
    calls = len(recording.calls)
    assert await manager.execute({"id": 1}, Counter(), timeout=5) == "v"
    assert len(recording.calls) == calls
    # The entry lives as long as the store said the record does, on the loop's clock; the
    # store judges by the manager's (moved) wall clock.
    await asyncio.sleep(1.05)
    clock.advance(3)
    work = Counter("fresh")
    assert await manager.execute({"id": 1}, work, timeout=5) == "fresh"
    assert work.runs == 1


async def test_clear_cache_leaves_the_store_alone(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording, local_cache=LocalCache())
    work = Counter("v")
    await manager.execute({"id": 1}, work, timeout=5)
    manager.clear_cache()
    assert await manager.execute({"id": 1}, work, timeout=5) == "v"
    assert work.runs == 1
    assert recording.calls.count("claim") == 2


async def test_store_round_trips_per_path(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording)
    other = make(recording)
    await manager.execute({"id": 1}, Counter(), timeout=5)
    assert recording.calls == ["claim", "complete"]
    recording.calls.clear()
    await other.execute({"id": 1}, Counter(), timeout=5)
    assert recording.calls == ["claim"]


async def test_in_process_duplicate_is_rejected_without_a_store_call(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording)
    task = await start_holding(manager, {"id": 1}, seconds=0.05, result="ok")
    before = list(recording.calls)
    with pytest.raises(errors.AlreadyInProgressError):
        await manager.execute({"id": 1}, Counter(), timeout=5)
    assert recording.calls == before
    await task


async def test_wait_joins_the_in_process_call_and_replays(store: Store) -> None:
    manager = make(store, wait=Wait())
    work = Counter({"v": 1}, delay=0.05)
    results = await asyncio.gather(
        *(manager.execute({"id": 1}, work, timeout=5) for _ in range(10))
    )
    assert results == [{"v": 1}] * 10
    assert work.runs == 1
    results[0]["v"] = 2
    assert results[1] == {"v": 1}


async def test_waiting_duplicate_claims_for_itself_when_the_first_call_fails(store: Store) -> None:
    manager = make(store, wait=Wait())
    first = await start_holding(
        manager, {"id": 1}, seconds=0.02, error=RuntimeError("first failed")
    )
    work = Counter("second")
    second = asyncio.create_task(manager.execute({"id": 1}, work, timeout=5))
    with pytest.raises(RuntimeError):
        await first
    assert await second == "second"
    assert work.runs == 1


async def test_wait_polls_another_process_until_it_completes(store: Store) -> None:
    holder = make(store)
    waiter = make(store, wait=Wait(timeout=5))
    task = await start_holding(holder, {"id": 1}, seconds=0.2, result="from-holder")
    work = Counter()
    assert await waiter.execute({"id": 1}, work, timeout=5) == "from-holder"
    assert work.runs == 0
    await task


async def test_wait_gives_up_after_its_timeout(store: Store) -> None:
    holder = make(store)
    waiter = make(store, wait=Wait(timeout=0.15))
    release = asyncio.Event()
    task = await start_holding(holder, {"id": 1}, until=release, result="late")
    loop = asyncio.get_running_loop()
    begun = loop.time()
    with pytest.raises(errors.AlreadyInProgressError):
        await waiter.execute({"id": 1}, Counter(), timeout=5)
    # Without Wait.timeout the waiter would poll until its own 5 s deadline: 2 s leaves a
    # slow machine's store round trips plenty of room and still tells the two apart.
    assert loop.time() - begun < 2.0
    release.set()
    await task


async def test_timeout_leaves_record_claimable_right_after_the_deadline(
    store: Store, clock: Clock
) -> None:
    # The stores judge leases by the managers' clock, held still here: on the wall clock the
    # cutoff comes only a reserve (40 ms) before the lease end, and a slow machine could
    # reach the second claim after it.
    manager = make(store, clock)
    other = make(store, clock)

    async def hang() -> None:
        await asyncio.sleep(10)

    with pytest.raises(TimeoutError):
        await manager.execute({"id": 1}, hang, timeout=0.2)
    with pytest.raises(errors.AlreadyInProgressError):
        await other.execute({"id": 1}, Counter(), timeout=5)
    clock.advance(0.21)
    work = Counter("second try")
    assert await other.execute({"id": 1}, work, timeout=5) == "second try"


@on_stores("memory", "dynamodb", "redis")
async def test_callback_is_cut_off_before_the_lease_ends(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording)
    loop = asyncio.get_running_loop()
    stopped_at: list[float] = []

    async def hang() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            stopped_at.append(loop.time())

    begun = loop.time()
    with pytest.raises(TimeoutError):
        await manager.execute({"id": 1}, hang, timeout=1.0)
    # Reserve is min(0.5 s, 20 % of 1 s) = 0.2 s: cut off at 0.8 s.  Cut off at the lease
    # end instead, it would stop at 1.0 s or later; the room above 0.8 s is for a loaded
    # machine's late wake-up.
    assert 0.75 <= stopped_at[0] - begun < 0.98
    assert recording.calls == ["claim"]


async def test_earliest_deadline_wins_and_becomes_the_lease(store: Store, clock: Clock) -> None:
    import idempotency_async

    recording = RecordingStore(store)
    manager = make(recording, clock)
    async with idempotency_async.deadline(2.0):
        await manager.execute({"id": 1}, Counter(), timeout=30)
        await manager.execute({"id": 2}, Counter(), timeout=1)
    first, second = recording.claims
    assert first.lease == pytest.approx(2.0, abs=0.05)
    assert second.lease == pytest.approx(1.0, abs=0.05)


async def test_no_deadline_uses_lease_option_and_warns_once(
    store: Store, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    recording = RecordingStore(store)
    manager = make(recording, clock, lease=120)
    with caplog.at_level(logging.WARNING, "idempotency_async"):
        await manager.execute({"id": 1}, Counter())
        await manager.execute({"id": 2}, Counter())
    assert caplog.text.count("without a deadline") == 1
    assert recording.claims[0].lease == 120


async def test_expired_deadline_raises_before_any_store_call(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording)
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        await manager.execute({"id": 1}, Counter(), deadline=loop.time() - 1)
    assert recording.calls == []


async def test_cancellation_propagates_with_no_store_call_after_it(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording)
    task = await start_holding(manager, {"id": 1}, seconds=10)
    calls_before_cancel = list(recording.calls)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.01)
    assert recording.calls == calls_before_cancel == ["claim"]
    assert asyncio.all_tasks() == {asyncio.current_task()}
    record = await record_of(store, manager.key_for({"id": 1}) or "")
    assert record is not None and record.status is Status.INPROGRESS


async def test_cancelled_holder_lets_a_waiting_duplicate_proceed_after_the_lease(
    store: Store,
) -> None:
    manager = make(store, wait=Wait(timeout=2))
    holder = await start_holding(manager, {"id": 1}, seconds=10, timeout=0.3)
    work = Counter("after lease")
    waiter = asyncio.create_task(manager.execute({"id": 1}, work, timeout=2))
    await asyncio.sleep(0.01)
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert await waiter == "after lease"
    assert work.runs == 1


async def test_events_report_the_lifecycle(store: Store) -> None:
    events: list[Event] = []
    manager = make(store, on_event=events.append, local_cache=LocalCache())
    await manager.execute({"id": 1}, Counter(), timeout=5)
    await manager.execute({"id": 1}, Counter(), timeout=5)
    other = make(store, on_event=events.append)
    await other.execute({"id": 1}, Counter(), timeout=5)
    assert [e.kind for e in events] == ["claimed", "completed", "cache_hit", "replayed"]
    assert events[1].duration is not None and events[1].duration >= 0


async def test_broken_event_hook_does_not_change_the_outcome(store: Store) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("metrics down")

    manager = make(store, on_event=broken)
    assert await manager.execute({"id": 1}, Counter("ok"), timeout=5) == "ok"


async def test_debug_event_lines_follow_levels_set_at_run_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The emitter reads logging's own cache of level answers: a level set, or logging
    # disabled, while the manager runs must show in the very next call.
    caplog.set_level(logging.DEBUG)
    log = logging.getLogger("idempotency_async")
    manager = make(MemoryStore())

    async def events_of(n: int) -> list[str]:
        caplog.clear()
        await manager.execute({"id": n}, Counter(), timeout=5)
        return [r.idempotency_event for r in caplog.records if hasattr(r, "idempotency_event")]

    try:
        log.setLevel(logging.INFO)
        assert await events_of(1) == []
        log.setLevel(logging.DEBUG)
        assert await events_of(2) == ["claimed", "completed"]
        log.setLevel(logging.INFO)
        assert await events_of(3) == []
        log.setLevel(logging.DEBUG)
        logging.disable(logging.DEBUG)
        assert await events_of(4) == []
        logging.disable(logging.NOTSET)
        assert await events_of(5) == ["claimed", "completed"]
        log.disabled = True
        assert await events_of(6) == []
    finally:
        logging.disable(logging.NOTSET)
        log.disabled = False
        log.setLevel(logging.NOTSET)


async def test_response_hook_sees_replays_only(store: Store) -> None:
    seen: list[Any] = []

    def hook(response: Any, record: Any) -> Any:
        seen.append((response, record.status))
        return {"replayed": response}

    manager = make(store, response_hook=hook)
    assert await manager.execute({"id": 1}, Counter(5), timeout=5) == 5
    assert await manager.execute({"id": 1}, Counter(), timeout=5) == {"replayed": 5}
    assert seen == [(5, Status.COMPLETED)]


async def test_disabled_environment_variable_skips_idempotency(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POWERTOOLS_IDEMPOTENCY_DISABLED", "Yes")
    recording = RecordingStore(store)
    manager = make(recording)
    work = Counter()
    await manager.execute({"id": 1}, work)
    await manager.execute({"id": 1}, work)
    assert work.runs == 2 and recording.calls == []


async def test_operator_release_unsticks_a_key(store: Store) -> None:
    manager = make(store)

    async def hang() -> None:
        await asyncio.sleep(10)

    with pytest.raises(TimeoutError):
        await manager.execute({"id": 1}, hang, timeout=0.05)
    key = manager.key_for({"id": 1})
    assert key is not None
    await manager.force_release(key)
    work = Counter("again")
    assert await manager.execute({"id": 1}, work, timeout=5) == "again"


async def test_many_concurrent_tasks_run_each_key_once(store: Store) -> None:
    # Four "processes" sharing one store; duplicates wait for the result.
    managers = [make(store, wait=Wait(timeout=30)) for _ in range(4)]
    runs: dict[int, int] = {}

    async def call(n: int) -> int:
        key_id = n % 20

        async def work() -> int:
            runs[key_id] = runs.get(key_id, 0) + 1
            await asyncio.sleep(0.01)
            return key_id

        return await managers[n % 4].execute({"id": key_id}, work, timeout=30)

    results = await asyncio.gather(*(call(n) for n in range(200)))
    assert results == [n % 20 for n in range(200)]
    assert runs == dict.fromkeys(range(20), 1)


def test_options_reject_invalid_values() -> None:
    with pytest.raises(errors.ConfigError, match="expires_after"):
        Options(expires_after=0)
    with pytest.raises(errors.ConfigError, match="expires_after"):
        Options(expires_after=-5)
    with pytest.raises(errors.ConfigError, match="max_items"):
        LocalCache(max_items=-1)
    with pytest.raises(errors.ConfigError, match="max_items"):
        LocalCache(max_items=True)
    with pytest.raises(errors.ConfigError, match="Wait"):
        Wait(timeout=0)
    with pytest.raises(errors.ConfigError, match=r"local_cache takes a LocalCache"):
        Options(local_cache=True)  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigError, match=r"Options\(wait=Wait\(timeout=10.0\)\)"):
        Options(wait=True)  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigError, match=r"renewal takes a Renewal"):
        Options(renewal=30.0)  # type: ignore[arg-type]
    with pytest.raises(errors.ConfigError, match="sha999"):
        Options(hash_function="sha999")
    with pytest.raises(errors.ConfigError, match="lease"):
        Options(lease=0)
    with pytest.raises(errors.ConfigError, match="JMESPath"):
        Manager(MemoryStore(), Options(event_key_jmespath="[[["))


def test_options_are_frozen() -> None:
    options = Options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.key_prefix = "other"  # type: ignore[misc]


def test_key_prefix_defaults_to_lambda_function_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "  orders-fn ")
    manager = Manager(MemoryStore(), Options())
    assert (manager.key_for({"a": 1}) or "").startswith("orders-fn#")
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME")
    # TypeScript-compatible: an empty prefix gives "#<hash>".
    assert Manager(MemoryStore(), Options()).key_for({}) == "#mZFLkyvTelC5g8XnyQrpOw=="


def test_key_uses_the_configured_hash() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="p", hash_function="sha256"))
    assert manager.key_for({}) == "p#RBNvo1WzZ4oRRq0W9+hknpT7T8If536DEMBg9hyq/4o="


async def test_raced_expiry_is_retried_and_then_claimed(store: Store) -> None:

    class RacyStore(RecordingStore):
        async def claim(self, claim: Any) -> Any:
            if not self.calls:
                self.calls.append("stale")
                return Verdict(Found.CLAIMABLE)
            return await super().claim(claim)

    racy = RacyStore(store)
    manager = make(racy)
    work = Counter("won")
    assert await manager.execute({"id": 1}, work, timeout=5) == "won"
    assert racy.calls == ["stale", "claim", "complete"]
    assert work.runs == 1


async def test_joined_duplicates_of_an_unstorable_result_get_not_stored(store: Store) -> None:
    manager = make(store, wait=Wait())
    sentinel = object()
    work = Counter(sentinel, delay=0.05)
    first = asyncio.create_task(manager.execute({"id": 1}, work, timeout=5))
    await asyncio.sleep(0.01)
    with pytest.raises(errors.ResponseNotStoredError):
        await manager.execute({"id": 1}, work, timeout=5)
    assert await first is sentinel
    assert work.runs == 1


async def test_joined_duplicate_gives_up_at_its_own_deadline(store: Store) -> None:
    manager = make(store, wait=Wait(timeout=10))
    work = Counter("slow", delay=0.5)
    first = asyncio.create_task(manager.execute({"id": 1}, work, timeout=5))
    await asyncio.sleep(0.01)
    with pytest.raises(TimeoutError):
        await manager.execute({"id": 1}, work, timeout=0.1)
    assert await first == "slow"
    assert work.runs == 1


async def test_a_coroutine_instead_of_a_callable_is_rejected_before_any_store_call(
    store: Store,
) -> None:
    recording = RecordingStore(store)
    manager = make(recording)
    coroutine = Counter()()
    with pytest.raises(errors.ConfigError, match="zero-argument callable"):
        await manager.execute({"id": 1}, coroutine, timeout=5)  # type: ignore[arg-type]
    coroutine.close()
    assert recording.calls == []


async def test_callback_mutating_its_payload_completes_the_original_key(store: Store) -> None:
    manager = make(store)
    payload = {"id": 1}

    async def mutate() -> str:
        payload["id"] = 2
        return "done"

    key = manager.key_for(payload)
    assert await manager.execute(payload, mutate, timeout=5) == "done"
    record = await record_of(store, key or "")
    assert record is not None and record.status is Status.COMPLETED


def test_key_prefix_is_trimmed_like_javascript_and_blank_means_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "fn")
    assert Manager(MemoryStore(), Options(key_prefix=" orders\n\ufeff")).key_prefix == "orders"
    # U+001F is not JavaScript whitespace (str.strip() would remove it).
    assert Manager(MemoryStore(), Options(key_prefix="\x1forders")).key_prefix == "\x1forders"
    assert Manager(MemoryStore(), Options(key_prefix="  ")).key_prefix == "fn"


async def test_callback_raising_its_own_timeout_error_releases_the_key(store: Store) -> None:
    manager = make(store)

    async def upstream_timeout() -> None:
        raise TimeoutError("payment API did not answer")

    with pytest.raises(TimeoutError, match="payment API"):
        await manager.execute({"id": 1}, upstream_timeout, timeout=5)
    work = Counter("retried")
    assert await manager.execute({"id": 1}, work, timeout=5) == "retried"


async def test_callback_that_swallows_the_cutoff_completes_and_leaves_the_task_clean(
    store: Store,
) -> None:
    manager = make(store)

    async def stubborn() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "finished anyway"
        return "never"

    assert await manager.execute({"id": 1}, stubborn, timeout=0.2) == "finished anyway"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    assert await manager.execute({"id": 1}, Counter(), timeout=5) == "finished anyway"


async def test_outside_cancellation_wins_over_the_cutoff(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording)

    async def hang() -> None:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_soon(task.cancel)  # someone else cancels us...
        # ...and the cutoff comes due in the same loop iteration: block the loop on purpose.
        time.sleep(0.35)  # noqa: ASYNC251
        await asyncio.sleep(10)

    task = asyncio.create_task(manager.execute({"id": 1}, hang, timeout=0.3))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert recording.calls == ["claim"]


async def test_cached_none_result_replays_without_a_store_call(store: Store) -> None:
    recording = RecordingStore(store)
    manager = make(recording, local_cache=LocalCache())
    await manager.execute({"id": 1}, Counter(None), timeout=5)
    calls = list(recording.calls)
    work = Counter("not run")
    assert await manager.execute({"id": 1}, work, timeout=5) is None
    assert recording.calls == calls and work.runs == 0


async def test_waiting_on_another_process_polls_with_reads_not_claims(store: Store) -> None:
    holder = make(store)
    recording = RecordingStore(store)
    waiter = make(recording, wait=Wait(timeout=5))
    task = await start_holding(holder, {"id": 1}, seconds=0.3, result="from-holder")
    assert await waiter.execute({"id": 1}, Counter(), timeout=5) == "from-holder"
    await task
    assert recording.calls[0] == "claim"
    assert set(recording.calls[1:]) == {"get"} and len(recording.calls) >= 3


async def test_waiter_claims_when_the_other_process_releases(store: Store) -> None:
    holder = make(store)
    waiter = make(store, wait=Wait(timeout=5))
    task = await start_holding(holder, {"id": 1}, seconds=0.15, error=RuntimeError("holder failed"))
    work = Counter("waiter ran")
    assert await waiter.execute({"id": 1}, work, timeout=5) == "waiter ran"
    assert work.runs == 1
    with pytest.raises(RuntimeError):
        await task


async def test_not_stored_event_says_why(store: Store) -> None:
    events: list[Event] = []
    manager = make(store, on_event=events.append)
    await manager.execute({"id": 1}, Counter("x" * (store.max_response_bytes + 1)), timeout=5)
    await manager.execute({"id": 2}, Counter(object()), timeout=5)
    errors_seen = [e.error for e in events if e.kind == "response_not_stored"]
    assert isinstance(errors_seen[0], errors.ResponseTooLargeError)
    assert errors_seen[0].size > errors_seen[0].limit == store.max_response_bytes
    assert isinstance(errors_seen[1], errors.ResponseEncodingError)


async def test_failing_response_codec_completes_as_not_stored(store: Store) -> None:
    class BrokenCodec:
        def encode(self, result: Any) -> Any:
            raise ValueError("cannot encode this result")

        def decode(self, stored: Any) -> Any:
            return stored

    manager = make(store, response_codec=BrokenCodec())
    work = Counter("charged")
    assert await manager.execute({"id": 1}, work, timeout=5) == "charged"
    with pytest.raises(errors.ResponseNotStoredError):
        await manager.execute({"id": 1}, work, timeout=5)
    assert work.runs == 1


def test_serialize_key_replaces_canonical_json_for_both_hashes() -> None:
    import base64
    import hashlib

    seen: list[Any] = []

    def serialize(value: Any) -> str:
        seen.append(value)
        return f"custom:{value}"

    manager = Manager(
        MemoryStore(),
        Options(
            key_prefix="p",
            event_key_jmespath="id",
            payload_validation_jmespath="amount",
            serialize_key=serialize,
        ),
    )
    expected = base64.b64encode(hashlib.md5(b"custom:7").digest()).decode()
    assert manager.key_for({"id": 7, "amount": 3}) == f"p#{expected}"
    assert seen == [7, 3]  # identity, then validation


async def test_lease_margin_extends_every_lease(store: Store, clock: Clock) -> None:
    recording = RecordingStore(store)
    manager = make(recording, clock, lease_margin=2.5)
    await manager.execute({"id": 1}, Counter(), timeout=10)
    assert recording.claims[0].lease == pytest.approx(12.5, abs=0.05)


async def test_custom_jmespath_functions_select_the_key(store: Store) -> None:
    from jmespath.functions import signature

    from idempotency_async.selection import PowertoolsFunctions

    class Functions(PowertoolsFunctions):
        @signature({"types": ["string"]})
        def _func_lower(self, value: str) -> str:
            return value.lower()

    manager = make(
        store,
        event_key_jmespath="lower(powertools_json(body).order)",
        jmespath_functions=Functions(),
    )
    work = Counter()
    await manager.execute({"body": '{"order": "ORD-1"}'}, work, timeout=5)
    await manager.execute({"body": '{"order": "ord-1", "note": "retry"}'}, work, timeout=5)
    assert work.runs == 1
