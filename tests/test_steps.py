"""Recovery points (steps) through the manager, on MemoryStore: what ``step(name, fn)`` and
``Call.step`` record, replay and refuse, at every door that has them today.

The store obligations behind them are the conformance kit's ``StepsContract``
(``tests/test_store_contract.py``); here the manager's side: each step runs once while the
record lives, a retry resumes, failures never release a key whose step may be unrecorded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import Clock, MemoryWrapper, record_of

from idempotency_async import (
    Call,
    Event,
    LocalCache,
    Manager,
    MemoryStore,
    Options,
    Renewal,
    Wait,
    downstream_key,
    errors,
    idempotent_function,
    step,
)
from idempotency_async.record import Claim, Record, Status
from idempotency_async.stores.base import Extended, Stepped, StepWrite

PAYLOAD = {"order": 7}


class Effects:
    """Counts each step function's runs (the effects a retry must not repeat)."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()

    def fn(self, name: str, value: Any = None) -> Callable[[], Awaitable[Any]]:
        async def effect() -> Any:
            self.runs[name] += 1
            return {"step": name} if value is None else value

        return effect

    async def take(self, *names: str) -> list[Any]:
        """Take the steps ``names`` in order; their results."""
        return [await step(name, self.fn(name)) for name in names]


class Events:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def __call__(self, event: Event) -> None:
        self.kinds.append(event.kind)

    def count(self, kind: str) -> int:
        return self.kinds.count(kind)


class Boom(Exception):
    """The callback's own failure, after some steps."""


def manager_for(store: Any, clock: Clock, **options: Any) -> Manager:
    options.setdefault("key_prefix", "steps")
    return Manager(store, Options(clock=clock, **options))


async def the_record(store: Any, manager: Manager, clock: Clock, payload: Any = PAYLOAD) -> Record:
    record = await record_of(store, manager.key_for(payload), clock.now)
    assert record is not None
    return record


def steps_of(record: Record | None) -> list[Any] | None:
    assert record is not None
    return None if record.steps is None else json.loads(record.steps)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


# -- the first run, a resume, the completion ------------------------------------------


async def test_a_first_run_records_each_step_once_as_it_finishes(
    store: MemoryStore, clock: Clock
) -> None:
    events = Events()
    manager = manager_for(store, clock, on_event=events)
    effects = Effects()
    seen: list[Any] = []

    async def place() -> dict[str, Any]:
        for n, name in enumerate(("create", "charge", "receipt")):
            await step(name, effects.fn(name))
            # Recorded before the next step starts.
            seen.append(steps_of(await the_record(store, manager, clock)))
            assert len(seen[-1]) == n + 1
        return {"done": True}

    assert await manager.execute(PAYLOAD, place, timeout=10) == {"done": True}
    assert seen[-1] == [
        ["create", {"step": "create"}],
        ["charge", {"step": "charge"}],
        ["receipt", {"step": "receipt"}],
    ]
    assert effects.runs == {"create": 1, "charge": 1, "receipt": 1}
    assert events.count("step_recorded") == 3 and events.count("step_replayed") == 0
    record = await the_record(store, manager, clock)
    assert record.status is Status.COMPLETED and record.steps is None
    assert record.response == {"done": True}


@pytest.mark.parametrize("k", [0, 1, 2, 3])
async def test_a_callback_that_raises_after_k_steps_resumes_at_the_next(
    store: MemoryStore, clock: Clock, k: int
) -> None:
    events = Events()
    manager = manager_for(store, clock, on_event=events)
    effects = Effects()
    names = ("create", "charge", "receipt")
    fail = [True]

    async def place() -> list[Any]:
        done = await effects.take(*names[:k])
        if fail[0]:
            raise Boom
        return done + await effects.take(*names[k:])

    with pytest.raises(Boom):
        await manager.execute(PAYLOAD, place, timeout=10)
    assert effects.runs == Counter(names[:k])
    record = await record_of(store, manager.key_for(PAYLOAD), clock.now)
    if k == 0:
        assert record is None, "a release without steps deletes the record"
    else:
        # Released with its progress: no owner, lease ended, claimable at once.
        assert record is not None and record.owner is None and record.status is Status.INPROGRESS
        assert record.lease_end is not None and record.lease_end < clock.now
        assert [name for name, _ in steps_of(record) or []] == list(names[:k])
    fail[0] = False
    result = await manager.execute(PAYLOAD, place, timeout=10)
    assert result == [{"step": name} for name in names]
    assert effects.runs == Counter(names), "a recorded step ran again"
    assert events.count("step_replayed") == k
    assert events.count("step_recorded") == 3
    # The final result completes the key and replays; nothing runs again.
    assert await manager.execute(PAYLOAD, place, timeout=10) == result
    assert effects.runs == Counter(names)
    record = await the_record(store, manager, clock)
    assert record.status is Status.COMPLETED and record.steps is None


async def test_a_crash_after_a_step_resumes_after_the_lease_and_not_before(
    store: MemoryStore, clock: Clock
) -> None:
    effects = Effects()
    first = manager_for(store, clock)
    crashed = asyncio.Event()

    async def dies_after_charge() -> Any:
        await effects.take("create", "charge")
        crashed.set()
        await asyncio.sleep(3600)  # the process dies here (the task is cancelled)

    task = asyncio.create_task(first.execute(PAYLOAD, dies_after_charge, timeout=30))
    await crashed.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Nothing was written for the crash: the holder's record, with its two steps.
    record = await the_record(store, first, clock)
    assert record.owner is not None and record.status is Status.INPROGRESS
    assert [entry[0] for entry in steps_of(record) or []] == ["create", "charge"]

    second = manager_for(store, clock)  # another process

    async def place() -> list[Any]:
        return await effects.take("create", "charge", "receipt")

    with pytest.raises(errors.AlreadyInProgressError):
        await second.execute(PAYLOAD, place, timeout=30)
    clock.advance(31)
    result = await second.execute(PAYLOAD, place, timeout=30)
    assert result == [{"step": "create"}, {"step": "charge"}, {"step": "receipt"}]
    assert effects.runs == {"create": 1, "charge": 1, "receipt": 1}


async def test_a_replayed_step_returns_an_independent_copy_of_its_recorded_value(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock)
    got: list[Any] = []
    fail = [True]
    values: list[Any] = [0, "", False, None, [], {}, {"nested": [1, 2.5, None]}]

    async def place() -> str:
        for n, value in enumerate(values):
            got.append(await step(f"s{n}", _returning(value)))
        got[-1]["nested"].append("mutated")  # the caller's copy, not the record's
        if fail[0]:
            raise Boom
        return "ok"

    with pytest.raises(Boom):
        await manager.execute(PAYLOAD, place, timeout=10)
    fail[0] = False
    got.clear()
    assert await manager.execute(PAYLOAD, place, timeout=10) == "ok"
    values[-1]["nested"].append("mutated")
    assert got == values
    assert [type(v) for v in got] == [type(v) for v in values]


def _returning(value: Any) -> Callable[[], Awaitable[Any]]:
    async def fn() -> Any:
        return json.loads(json.dumps(value))

    return fn


async def test_a_plain_function_can_be_a_step(store: MemoryStore, clock: Clock) -> None:
    manager = manager_for(store, clock)

    async def place() -> Any:
        return await step("sync", lambda: 41)  # type: ignore[arg-type,return-value]

    assert await manager.execute(PAYLOAD, place, timeout=10) == 41


# -- a mismatch -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "second_run", [("create", "refund"), ("charge", "create"), ("create-v2",)], ids=str
)
async def test_a_renamed_or_reordered_step_is_a_mismatch_on_every_retry(
    store: MemoryStore, clock: Clock, second_run: tuple[str, ...]
) -> None:
    manager = manager_for(store, clock)
    effects = Effects()
    names = ["create", "charge"]

    async def place() -> Any:
        await effects.take(*names)
        raise Boom

    with pytest.raises(Boom):
        await manager.execute(PAYLOAD, place, timeout=10)
    before = await the_record(store, manager, clock)
    names[:] = second_run
    position = next(n for n, name in enumerate(second_run) if name != ("create", "charge")[n])
    for _ in range(3):
        with pytest.raises(errors.StepMismatchError) as caught:
            await manager.execute(PAYLOAD, place, timeout=10)
        error = caught.value
        assert error.position == position
        assert error.recorded == ("create", "charge")[position]
        assert error.asked == second_run[position]
        assert error.key == manager.key_for(PAYLOAD)
    assert effects.runs == {"create": 1, "charge": 1}, "a mismatched step's function ran"
    after = await the_record(store, manager, clock)
    assert after.steps == before.steps and after.owner is None


# -- results that cannot be stored ------------------------------------------------------


async def test_a_result_that_is_not_json_is_recorded_not_stored_and_never_runs_again(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock)
    effects = Effects()

    async def place() -> Any:
        await step("create", effects.fn("create"))
        await step("socket", effects.fn("socket", object()))
        return "unreachable"

    for _ in range(3):
        with pytest.raises(errors.StepResultNotStoredError) as caught:
            await manager.execute(PAYLOAD, place, timeout=10)
        assert caught.value.step == "socket" and "JSON" in caught.value.reason
    assert effects.runs == {"create": 1, "socket": 1}
    record = await the_record(store, manager, clock)
    entries = steps_of(record)
    assert entries is not None and entries[0] == ["create", {"step": "create"}]
    assert entries[1][:2] == ["socket", None] and "JSON" in entries[1][2]


async def test_a_callback_may_catch_a_result_not_stored_and_complete(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock)
    effects = Effects()

    async def place() -> str:
        with contextlib.suppress(errors.StepResultNotStoredError):
            await step("socket", effects.fn("socket", object()))
        return "done"

    assert await manager.execute(PAYLOAD, place, timeout=10) == "done"
    assert await manager.execute(PAYLOAD, place, timeout=10) == "done"
    assert effects.runs == {"socket": 1}


async def test_a_result_past_the_stores_bound_is_recorded_not_stored(clock: Clock) -> None:
    store = MemoryStore(max_response_bytes=1000)
    manager = manager_for(store, clock)
    effects = Effects()

    async def place() -> Any:
        await step("small", effects.fn("small", "x" * 500))
        await step("big", effects.fn("big", "y" * 600))  # the list would pass 1000 bytes
        return "unreachable"

    for _ in range(2):
        with pytest.raises(errors.StepResultNotStoredError) as caught:
            await manager.execute(PAYLOAD, place, timeout=10)
        assert caught.value.step == "big" and "1000" in caught.value.reason
    assert effects.runs == {"small": 1, "big": 1}
    entries = steps_of(await the_record(store, manager, clock))
    assert entries is not None and entries[0] == ["small", "x" * 500]
    assert entries[1][:2] == ["big", None]


class BoundedLower(MemoryStore):
    """A store whose own bound on the step list is lower than ``max_response_bytes``
    (DynamoDB's item limit): it answers TOO_LARGE where the manager's check passed."""

    async def record_step(self, write: StepWrite) -> Stepped:
        if len(write.steps) > 200:
            return Stepped.TOO_LARGE
        return await super().record_step(write)


async def test_a_list_the_store_finds_too_large_is_recorded_not_stored(clock: Clock) -> None:
    store = BoundedLower()
    manager = manager_for(store, clock)
    effects = Effects()

    async def place() -> Any:
        await step("big", effects.fn("big", "z" * 300))
        return "unreachable"

    for _ in range(2):
        with pytest.raises(errors.StepResultNotStoredError, match="did not fit"):
            await manager.execute(PAYLOAD, place, timeout=10)
    assert effects.runs == {"big": 1}
    entries = steps_of(await the_record(store, manager, clock))
    assert entries is not None and entries[0][:2] == ["big", None]


async def test_a_step_whose_not_stored_entry_cannot_fit_either_is_not_recorded(
    clock: Clock,
) -> None:
    """The steps before it fill the record: the step ran, nothing of it fits, so the key
    is left to its lease (never reported as a lease another worker took)."""
    store = MemoryStore(max_response_bytes=1000)
    manager = manager_for(store, clock)
    effects = Effects()

    async def place() -> Any:
        await step("small", effects.fn("small", "x" * 980))
        await step("big", effects.fn("big", "y" * 10))
        return "unreachable"

    with pytest.raises(errors.StepNotRecordedError, match="step list is full") as caught:
        await manager.execute(PAYLOAD, place, timeout=10)
    assert caught.value.result == "y" * 10
    record = await the_record(store, manager, clock)
    assert record.owner is not None  # not released: left to its lease
    assert steps_of(record) == [["small", "x" * 980]]
    assert effects.runs == {"small": 1, "big": 1}


# -- failed step writes, lost leases ------------------------------------------------------


class FailingStepWrites(MemoryStore):
    """Fault injection on ``record_step``: raise before the write applies (``fail``), or
    apply it and lose the answer (``lose``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: set[int] = set()
        self.lose: set[int] = set()
        self.writes: list[StepWrite] = []

    async def record_step(self, write: StepWrite) -> Stepped:
        self.writes.append(write)
        if write.position in self.fail:
            raise errors.StoreUnavailableError("step write failed (injected)")
        answer = await super().record_step(write)
        if write.position in self.lose:
            raise errors.StoreUnavailableError("step write answer lost (injected)")
        return answer


@pytest.mark.parametrize("fault", ["fail", "lose"])
async def test_a_failed_step_write_leaves_the_key_to_its_lease(clock: Clock, fault: str) -> None:
    store = FailingStepWrites()
    getattr(store, fault).add(1)
    events = Events()
    manager = manager_for(store, clock, on_event=events)
    effects = Effects()

    async def place() -> list[Any]:
        return await effects.take("create", "charge", "receipt")

    with pytest.raises(errors.StepNotRecordedError) as caught:
        await manager.execute(PAYLOAD, place, timeout=30)
    assert isinstance(caught.value, errors.CompletionError)
    assert caught.value.result == {"step": "charge"} and caught.value.outcome_unknown
    assert effects.runs == {"create": 1, "charge": 1}
    assert events.count("released") == 0
    record = await the_record(store, manager, clock)
    assert record.owner is not None, "the key was released while a step may be unrecorded"
    getattr(store, fault).clear()
    # Before the lease ends: in progress, nothing runs.
    with pytest.raises(errors.AlreadyInProgressError):
        await manager_for(store, clock).execute(PAYLOAD, place, timeout=30)
    assert effects.runs == {"create": 1, "charge": 1}
    # After it: the retry runs only the step whose recovery point is missing.
    clock.advance(31)
    assert await manager_for(store, clock).execute(PAYLOAD, place, timeout=30) == [
        {"step": "create"},
        {"step": "charge"},
        {"step": "receipt"},
    ]
    expected = {"create": 1, "charge": 2 if fault == "fail" else 1, "receipt": 1}
    assert effects.runs == expected


async def test_a_caught_step_write_failure_never_releases_the_key(clock: Clock) -> None:
    store = FailingStepWrites()
    store.fail.add(0)
    manager = manager_for(store, clock)

    async def place(call: Call) -> str:
        try:
            await call.step("charge", _returning("ch_1"))
        except errors.StepNotRecordedError:
            call.release("gave up")
        return "released?"

    assert await manager.execute_call(PAYLOAD, place, timeout=30) == "released?"
    record = await the_record(store, manager, clock)
    assert record.owner is not None and record.status is Status.INPROGRESS


async def test_a_step_write_after_another_worker_took_the_key_is_a_lost_lease(
    store: MemoryStore, clock: Clock
) -> None:
    events = Events()
    manager = manager_for(store, clock, on_event=events)
    key = manager.key_for(PAYLOAD)
    assert key is not None
    taken: list[Record | None] = []

    async def slow_charge() -> str:
        # The lease ends and another worker claims the key (keeping the first step).
        clock.advance(31)
        record = await record_of(store, key, clock.now)
        assert record is not None
        other = Claim(key, "other-worker", clock.now, 30.0, 3600.0, record.validation)
        verdict = await store.claim(other)
        taken.append(verdict.record)
        return "ch_1"

    async def place() -> Any:
        await step("create", _returning(1))
        return await step("charge", slow_charge)

    with pytest.raises(errors.LeaseLostError) as caught:
        await manager.execute(PAYLOAD, place, timeout=30)
    assert caught.value.result == "ch_1"
    assert events.count("lease_lost") >= 1 and events.count("released") == 0
    record = await the_record(store, manager, clock)
    assert record.owner == "other-worker" and steps_of(record) == [["create", 1]]


# -- misuse: ConfigError before the function runs --------------------------------------


async def test_a_step_outside_a_running_call_is_refused() -> None:
    effects = Effects()
    with pytest.raises(errors.ConfigError, match="outside a running idempotent call"):
        await step("charge", effects.fn("charge"))
    assert not effects.runs


async def test_a_step_in_a_task_that_outlived_its_call_is_refused(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock)
    effects = Effects()
    later: list[asyncio.Task[Any]] = []
    go = asyncio.Event()

    async def background() -> Any:
        await go.wait()
        return await step("late", effects.fn("late"))

    async def place() -> str:
        later.append(asyncio.create_task(background()))
        return "ok"

    assert await manager.execute(PAYLOAD, place, timeout=10) == "ok"
    go.set()
    with pytest.raises(errors.ConfigError):
        await later[0]
    assert not effects.runs


async def test_a_step_after_call_complete_is_refused(store: MemoryStore, clock: Clock) -> None:
    manager = manager_for(store, clock)
    effects = Effects()

    async def place(call: Call) -> str:
        await call.step("create", effects.fn("create"))
        await call.complete("answered")
        await step("after", effects.fn("after"))
        return "unreachable"

    with pytest.raises(errors.ConfigError, match="after the call was completed"):
        await manager.execute_call(PAYLOAD, place, timeout=10)
    assert effects.runs == {"create": 1}
    record = await the_record(store, manager, clock)
    assert record.status is Status.COMPLETED and record.response == "answered"
    assert record.steps is None


async def _refused(
    manager: Manager, body: Callable[[Effects], Awaitable[Any]], match: str
) -> Effects:
    effects = Effects()
    with pytest.raises(errors.ConfigError, match=match):
        await manager.execute(PAYLOAD, lambda: body(effects), timeout=10)
    return effects


async def test_a_step_name_taken_twice_is_refused(store: MemoryStore, clock: Clock) -> None:
    async def body(effects: Effects) -> Any:
        await step("charge", effects.fn("charge"))
        await step("charge", effects.fn("charge-again"))

    effects = await _refused(manager_for(store, clock), body, "taken twice")
    assert effects.runs == {"charge": 1}


async def test_a_step_inside_a_step_is_refused(store: MemoryStore, clock: Clock) -> None:
    async def body(effects: Effects) -> Any:
        async def outer() -> Any:
            return await step("inner", effects.fn("inner"))

        await step("outer", outer)

    effects = await _refused(manager_for(store, clock), body, "started while step 'outer'")
    assert not effects.runs


async def test_two_steps_under_gather_are_refused_and_the_running_one_is_not_released(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock)
    effects = Effects()
    release = asyncio.Event()

    async def slow() -> str:
        await release.wait()
        effects.runs["slow"] += 1
        return "slow"

    async def body() -> Any:
        return await asyncio.gather(step("slow", slow), step("fast", effects.fn("fast")))

    with pytest.raises(errors.ConfigError, match="one at a time"):
        await manager.execute(PAYLOAD, body, timeout=30)
    assert not effects.runs
    # The first step still runs (gather does not cancel it): a retry must not run it
    # again beside it — the key stays held until its lease ends.
    with pytest.raises(errors.AlreadyInProgressError):
        await manager_for(store, clock).execute(PAYLOAD, body, timeout=30)
    release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert effects.runs == {"slow": 1}
    # It finished under the key it still holds: its recovery point is on the record.
    record = await the_record(store, manager, clock)
    assert steps_of(record) == [["slow", "slow"]]


async def test_more_than_64_steps_are_refused(store: MemoryStore, clock: Clock) -> None:
    async def body(effects: Effects) -> Any:
        for n in range(65):
            await step(f"s{n}", effects.fn(f"s{n}", n))

    effects = await _refused(manager_for(store, clock), body, "at most 64 steps")
    assert len(effects.runs) == 64 and "s64" not in effects.runs


@pytest.mark.parametrize("name", ["", "x" * 101, 7, None], ids=["empty", "101", "int", "none"])
async def test_a_bad_step_name_is_refused(store: MemoryStore, clock: Clock, name: Any) -> None:
    async def body(effects: Effects) -> Any:
        await step(name, effects.fn("bad"))

    effects = await _refused(manager_for(store, clock), body, "needs a name")
    assert not effects.runs


async def test_a_hundred_character_name_is_a_name(store: MemoryStore, clock: Clock) -> None:
    manager = manager_for(store, clock)

    async def body() -> Any:
        return await step("n" * 100, _returning(1))

    assert await manager.execute(PAYLOAD, body, timeout=10) == 1


class NoSteps(MemoryWrapper):
    """A store of the protocol without the steps capability (no ``record_step``)."""


async def test_a_store_without_the_capability_refuses_steps(clock: Clock) -> None:
    store = NoSteps()
    manager = manager_for(store, clock)

    async def body(effects: Effects) -> Any:
        await step("charge", effects.fn("charge"))

    effects = await _refused(manager, body, "NoSteps does not record steps")
    assert not effects.runs
    assert await record_of(store, manager.key_for(PAYLOAD), clock.now) is None  # released


# -- unprotected calls --------------------------------------------------------------------


async def test_steps_run_unrecorded_when_idempotency_is_disabled(
    store: MemoryStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POWERTOOLS_IDEMPOTENCY_DISABLED", "1")
    manager = manager_for(store, clock)
    effects = Effects()

    async def place() -> list[Any]:
        return await effects.take("create", "charge")

    for _ in range(2):
        assert await manager.execute(PAYLOAD, place, timeout=10) == [
            {"step": "create"},
            {"step": "charge"},
        ]
    assert effects.runs == {"create": 2, "charge": 2}
    assert len(store) == 0


async def test_steps_run_unrecorded_when_the_payload_selects_no_key(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock, event_key_jmespath="id")
    effects = Effects()

    async def place(call: Call) -> list[Any]:
        return [await call.step("create", effects.fn("create"))]

    for _ in range(2):
        assert await manager.execute_call({"other": 1}, place, timeout=10) == [{"step": "create"}]
    assert effects.runs == {"create": 2}
    assert len(store) == 0


# -- another payload, expiry --------------------------------------------------------------


async def test_another_payloads_retry_cannot_resume_the_progress(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(
        store, clock, event_key_jmespath="id", payload_validation_jmespath="amount"
    )
    effects = Effects()
    fail = [True]

    async def place() -> list[Any]:
        done = await effects.take("create")
        if fail[0]:
            raise Boom
        return done + await effects.take("charge")

    first = {"id": 1, "amount": 5}
    with pytest.raises(Boom):
        await manager.execute(first, place, timeout=10)
    before = await the_record(store, manager, clock, first)
    fail[0] = False
    for _ in range(2):
        with pytest.raises(errors.PayloadValidationError):
            await manager.execute({"id": 1, "amount": 6}, place, timeout=10)
    assert effects.runs == {"create": 1}
    assert await the_record(store, manager, clock, first) == before
    assert await manager.execute(first, place, timeout=10) == [
        {"step": "create"},
        {"step": "charge"},
    ]
    assert effects.runs == {"create": 1, "charge": 1}


async def test_an_expired_records_steps_all_run_again(store: MemoryStore, clock: Clock) -> None:
    manager = manager_for(store, clock, expires_after=60)
    effects = Effects()
    fail = [True]

    async def place() -> list[Any]:
        done = await effects.take("create", "charge")
        if fail[0]:
            raise Boom
        return done

    with pytest.raises(Boom):
        await manager.execute(PAYLOAD, place, timeout=10)
    clock.advance(62)
    fail[0] = False
    assert len(await manager.execute(PAYLOAD, place, timeout=10)) == 2
    assert effects.runs == {"create": 2, "charge": 2}


# -- downstream keys --------------------------------------------------------------------


def _in_step_key(record_key: str, step_name: str, name: str) -> str:
    """A downstream key derived inside a step, recomputed from the documented formula:
    SHA-256 over the domain tag, the scope kind ``S``, the record key's length (8 bytes,
    big-endian) and bytes, then the step's UTF-8 length (as 16 hex digits), the step's
    name, the kind ``N`` (a named key) and the name; base64url without padding."""
    raw = record_key.encode()
    step_raw = step_name.encode()
    tail = f"{len(step_raw):016x}{step_name}N{name}".encode()
    digest = hashlib.sha256(
        b"idempotency-async/downstream-key/v1\x00S" + len(raw).to_bytes(8, "big") + raw + tail
    ).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


async def test_downstream_keys_are_scoped_by_step_and_stable_across_runs(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock, expires_after=60)
    runs: list[dict[str, str]] = []

    async def place() -> str:
        seen = {"outside": downstream_key("charge")}

        async def in_step(name: str) -> str:
            seen[name] = downstream_key("charge")
            return seen[name]

        await step("charge-1", lambda: in_step("charge-1"))
        await step("charge-2", lambda: in_step("charge-2"))
        await step("café ☕", lambda: in_step("café ☕"))
        seen["after"] = downstream_key("charge")
        runs.append(seen)
        return "ok"

    await manager.execute(PAYLOAD, place, timeout=10)
    clock.advance(3700)  # expired: every step runs again, under the same key
    await manager.execute(PAYLOAD, place, timeout=10)
    key = manager.key_for(PAYLOAD)
    assert key is not None
    first, second = runs
    assert first == second
    for name in ("charge-1", "charge-2", "café ☕"):
        assert first[name] == _in_step_key(key, name, "charge"), name
    assert len({first["outside"], first["charge-1"], first["charge-2"], first["café ☕"]}) == 4
    assert first["after"] == first["outside"]


async def test_httpx_hook_numbers_requests_per_step(store: MemoryStore, clock: Clock) -> None:
    httpx = pytest.importorskip("httpx")
    from idempotency_async.downstream import httpx_event_hook

    sent: list[str | None] = []

    def answer(request: Any) -> Any:
        sent.append(request.headers.get("Idempotency-Key"))
        return httpx.Response(200, json={})

    manager = manager_for(store, clock)
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(answer),
        event_hooks={"request": [httpx_event_hook(hosts=["pay.example"])]},
    ) as client:

        async def charge() -> int:
            await client.post("https://pay.example/charges")
            await client.post("https://pay.example/charges")
            return 1

        async def place() -> str:
            await client.post("https://pay.example/charges")
            await step("a", charge)
            await step("b", charge)
            return "ok"

        await manager.execute(PAYLOAD, place, timeout=10)
    _outside, _a1, _a2, b1, b2 = sent
    assert len(set(sent)) == 5 and None not in sent
    # Requests are numbered within their step: a run that replays step a (no requests)
    # and runs only step b sends the keys b sent the first time, although they are the
    # run's first requests and were its fourth and fifth.
    sent_before = list(sent)
    sent.clear()
    await store.force_release(manager.key_for(PAYLOAD) or "")
    fail = [True]
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(answer),
        event_hooks={"request": [httpx_event_hook(hosts=["pay.example"])]},
    ) as client:

        async def charge_again() -> int:
            await client.post("https://pay.example/charges")
            await client.post("https://pay.example/charges")
            return 1

        async def only_b() -> str:
            await step("a", _returning(1))
            if fail[0]:
                raise Boom
            await step("b", charge_again)
            return "ok"

        with pytest.raises(Boom):
            await manager.execute(PAYLOAD, only_b, timeout=10)
        fail[0] = False
        await manager.execute(PAYLOAD, only_b, timeout=10)
    replay = list(sent)
    assert replay == [b1, b2], (replay, sent_before)


# -- events, renewal, cache, doors ------------------------------------------------------


async def test_steps_recorded_and_replayed_are_events(store: MemoryStore, clock: Clock) -> None:
    events = Events()
    manager = manager_for(store, clock, on_event=events)
    fail = [True]

    async def place() -> str:
        await step("a", _returning(1))
        await step("b", _returning(2))
        if fail[0]:
            raise Boom
        await step("c", _returning(3))
        return "ok"

    with pytest.raises(Boom):
        await manager.execute(PAYLOAD, place, timeout=10)
    assert events.kinds.count("step_recorded") == 2
    fail[0] = False
    events.kinds.clear()
    await manager.execute(PAYLOAD, place, timeout=10)
    assert events.kinds.count("step_replayed") == 2
    assert events.kinds.count("step_recorded") == 1
    assert events.kinds.index("claimed") < events.kinds.index("step_replayed")


class CountingExtends(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.extended: list[Extended] = []

    async def extend(self, claim: Claim) -> Extended:
        answer = await super().extend(claim)
        self.extended.append(answer)
        return answer


async def test_renewals_keep_the_steps() -> None:
    # Real time: the renewal runs on the loop's clock.
    store = CountingExtends()
    manager = Manager(store, Options(key_prefix="steps", renewal=Renewal(lease=0.6, every=0.15)))
    effects = Effects()
    fail = [True]

    async def place() -> list[Any]:
        done = await effects.take("create")
        await asyncio.sleep(1.0)  # past the first lease: renewed meanwhile
        done += await effects.take("charge")  # applies only if the renewal kept step 1
        if fail[0]:
            raise Boom
        return done

    with pytest.raises(Boom):
        await manager.execute(PAYLOAD, place, timeout=10)
    assert Extended.RENEWED in store.extended, "no renewal while the step list was held"
    record = await record_of(store, manager.key_for(PAYLOAD), manager.options.clock())
    assert [entry[0] for entry in steps_of(record) or []] == ["create", "charge"]
    fail[0] = False
    assert len(await manager.execute(PAYLOAD, place, timeout=10)) == 2
    assert effects.runs == {"create": 1, "charge": 1}


async def test_the_local_cache_never_serves_a_step_result(store: MemoryStore, clock: Clock) -> None:
    manager = manager_for(store, clock, local_cache=LocalCache(max_items=10))
    effects = Effects()
    fail = [True]

    async def place() -> dict[str, Any]:
        created = await step("create", effects.fn("create"))
        if fail[0]:
            raise Boom
        return {"final": created}

    with pytest.raises(Boom):
        await manager.execute(PAYLOAD, place, timeout=10)
    fail[0] = False
    result = await manager.execute(PAYLOAD, place, timeout=10)
    assert result == {"final": {"step": "create"}}
    await store.force_release(manager.key_for(PAYLOAD) or "")  # only the cache has it now
    assert await manager.execute(PAYLOAD, place, timeout=10) == result
    assert effects.runs == {"create": 1}


async def test_execute_call_and_call_step(store: MemoryStore, clock: Clock) -> None:
    manager = manager_for(store, clock)
    effects = Effects()
    fail = [True]

    async def place(call: Call) -> list[Any]:
        first = await call.step("create", effects.fn("create"))
        if fail[0]:
            raise Boom
        second = await step("charge", effects.fn("charge"))  # the same thing, two spellings
        await call.complete([first, second])
        return [first, second]

    with pytest.raises(Boom):
        await manager.execute_call(PAYLOAD, place, timeout=10)
    fail[0] = False
    assert await manager.execute_call(PAYLOAD, place, timeout=10) == [
        {"step": "create"},
        {"step": "charge"},
    ]
    assert effects.runs == {"create": 1, "charge": 1}


async def test_the_idempotent_function_decorator_resumes_steps(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock)
    effects = Effects()
    fail = [True]

    @idempotent_function(manager, payload="order", timeout=10)
    async def place(order: dict[str, Any]) -> list[Any]:
        done = await effects.take("create")
        if fail[0]:
            raise Boom
        return done + await effects.take("charge")

    with pytest.raises(Boom):
        await place(PAYLOAD)
    fail[0] = False
    assert len(await place(PAYLOAD)) == 2
    assert await place(PAYLOAD) == [{"step": "create"}, {"step": "charge"}]
    assert effects.runs == {"create": 1, "charge": 1}


async def test_a_caller_cancelled_during_a_step_writes_nothing_and_keeps_the_key(
    store: MemoryStore, clock: Clock
) -> None:
    events = Events()
    manager = manager_for(store, clock, on_event=events)
    inside = asyncio.Event()

    async def charging() -> str:
        inside.set()
        await asyncio.sleep(3600)
        return "never"

    async def place() -> Any:
        await step("create", _returning(1))
        return await step("charge", charging)

    task = asyncio.create_task(manager.execute(PAYLOAD, place, timeout=30))
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    record = await the_record(store, manager, clock)
    assert record.owner is not None and record.status is Status.INPROGRESS, "released"
    assert steps_of(record) == [["create", 1]]
    assert events.count("step_recorded") == 1 and events.count("released") == 0


async def test_in_process_duplicates_of_a_stepped_call_replay_its_result(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock, wait=Wait(timeout=10))
    effects = Effects()
    go = asyncio.Event()

    async def place() -> list[Any]:
        done = await effects.take("create")
        await go.wait()
        return done + await effects.take("charge")

    calls = [asyncio.create_task(manager.execute(PAYLOAD, place, timeout=10)) for _ in range(4)]
    for _ in range(10):
        await asyncio.sleep(0)
    go.set()
    results = await asyncio.gather(*calls)
    assert all(result == [{"step": "create"}, {"step": "charge"}] for result in results)
    assert effects.runs == {"create": 1, "charge": 1}


# -- lost claim answers, damaged records, releases, cutoffs, waiters ---------------------


class LostClaimAnswers(MemoryStore):
    """Fault injection: the next claim applies, and its answer is lost."""

    lose = False

    async def claim(self, claim: Claim) -> Any:
        verdict = await super().claim(claim)
        if self.lose:
            self.lose = False
            raise errors.StoreUnavailableError("claim answer lost (injected)")
        return verdict


async def test_a_claim_whose_answer_was_lost_releases_keeping_the_steps_it_never_saw(
    clock: Clock,
) -> None:
    store = LostClaimAnswers()
    manager = manager_for(store, clock)
    effects = Effects()
    fail = [True]

    async def place() -> list[Any]:
        done = await effects.take("create")
        if fail[0]:
            raise Boom
        return done + await effects.take("charge")

    with pytest.raises(Boom):
        await manager.execute(PAYLOAD, place, timeout=10)
    store.lose = True
    with pytest.raises(errors.StoreUnavailableError):
        await manager.execute(PAYLOAD, place, timeout=10)
    # The claim applied (kept the step) and was released again: the step is still there.
    record = await the_record(store, manager, clock)
    assert record.owner is None and steps_of(record) == [["create", {"step": "create"}]]
    fail[0] = False
    assert len(await manager.execute(PAYLOAD, place, timeout=10)) == 2
    assert effects.runs == {"create": 1, "charge": 1}


async def test_a_step_list_that_cannot_be_read_runs_nothing_and_keeps_the_key(
    store: MemoryStore, clock: Clock
) -> None:
    events = Events()
    manager = manager_for(store, clock, on_event=events)
    key = manager.key_for(PAYLOAD)
    assert key is not None
    await store.claim(Claim(key, "crashed", clock.now, 5.0, 3600.0, None))
    damaged = StepWrite(key, "crashed", clock.now, 3600.0, 0, '{"not": "a list"}')
    assert await store.record_step(damaged) is Stepped.RECORDED
    clock.advance(6)
    effects = Effects()

    async def place() -> list[Any]:
        return await effects.take("create")

    with pytest.raises(errors.InconsistentStateError, match="cannot be read"):
        await manager.execute(PAYLOAD, place, timeout=10)
    assert not effects.runs
    assert events.count("record_unreadable") == 1
    record = await the_record(store, manager, clock)
    assert record.owner not in (None, "crashed"), "the claim was released or never applied"


async def test_call_release_after_steps_keeps_the_progress(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock)
    effects = Effects()
    give_back = [True]

    async def place(call: Call) -> Any:
        await call.step("create", effects.fn("create"))
        if give_back[0]:
            call.release("not yet")
            return "released"
        return [await call.step("charge", effects.fn("charge"))]

    assert await manager.execute_call(PAYLOAD, place, timeout=10) == "released"
    record = await the_record(store, manager, clock)
    assert record.owner is None and len(steps_of(record) or []) == 1
    give_back[0] = False
    assert await manager.execute_call(PAYLOAD, place, timeout=10) == [{"step": "charge"}]
    assert effects.runs == {"create": 1, "charge": 1}


async def test_a_call_cut_off_in_a_step_keeps_its_progress_until_the_lease_ends(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock, completion_reserve=0.1)
    effects = Effects()
    slow = [True]

    async def charge() -> str:
        effects.runs["charge"] += 1
        if slow[0]:
            await asyncio.sleep(5)
        return "ch_1"

    async def place() -> list[Any]:
        return [await step("create", effects.fn("create")), await step("charge", charge)]

    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute(PAYLOAD, place, timeout=0.4)
    record = await the_record(store, manager, clock)
    assert record.owner is not None and len(steps_of(record) or []) == 1
    slow[0] = False
    with pytest.raises(errors.AlreadyInProgressError):
        await manager.execute(PAYLOAD, place, timeout=10)
    clock.advance(1)
    assert len(await manager.execute(PAYLOAD, place, timeout=10)) == 2
    assert effects.runs == {"create": 1, "charge": 2}


@pytest.mark.parametrize("where", ["this process", "another process"])
async def test_a_waiting_duplicate_resumes_the_progress_its_holder_released(
    store: MemoryStore, clock: Clock, where: str
) -> None:
    holder = manager_for(store, clock, wait=Wait(timeout=10))
    waiter = holder if where == "this process" else manager_for(store, clock, wait=Wait(timeout=10))
    effects = Effects()
    go = asyncio.Event()
    fail = [True]

    created = asyncio.Event()

    async def place() -> list[Any]:
        done = await effects.take("create")
        if fail[0]:
            fail[0] = False
            created.set()
            await go.wait()
            raise Boom
        return done + await effects.take("charge")

    first = asyncio.create_task(holder.execute(PAYLOAD, place, timeout=10))
    await created.wait()
    second = asyncio.create_task(waiter.execute(PAYLOAD, place, timeout=10))
    await asyncio.sleep(0.1)  # waiting on the holder
    go.set()
    with pytest.raises(Boom):
        await first
    assert await second == [{"step": "create"}, {"step": "charge"}]
    assert effects.runs == {"create": 1, "charge": 1}


class Declined(Exception):
    pass


async def test_a_declared_error_after_steps_completes_without_them(
    store: MemoryStore, clock: Clock
) -> None:
    manager = manager_for(store, clock, replay_errors=(Declined,))
    effects = Effects()

    async def place() -> Any:
        await effects.take("create")
        raise Declined("card declined")

    for _ in range(2):
        with pytest.raises(Declined):
            await manager.execute(PAYLOAD, place, timeout=10)
    assert effects.runs == {"create": 1}
    record = await the_record(store, manager, clock)
    assert record.status is Status.COMPLETED and record.steps is None


# -- a step write in flight when the call is cut off or cancelled ------------------------


class SlowStepWrites(MemoryStore):
    """Fault injection: each step write takes ``delay`` seconds before it applies."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.answered: list[Stepped] = []

    async def record_step(self, write: StepWrite) -> Stepped:
        await asyncio.sleep(self.delay)
        answer = await super().record_step(write)
        self.answered.append(answer)
        return answer


async def test_a_step_write_in_flight_at_the_cutoff_is_bounded_at_the_lease_end() -> None:
    # Lease 1.2 s, cutoff 0.6 s before it; the step's function returns at 0.3 s and its
    # write takes 0.5 s: in flight when the cutoff fires, done well before the lease ends.
    store = SlowStepWrites(0.5)
    manager = Manager(store, Options(key_prefix="steps", completion_reserve=0.6))
    effects = Effects()

    async def charge() -> str:
        await asyncio.sleep(0.3)
        effects.runs["charge"] += 1
        return "ch_1"

    async def place() -> Any:
        await step("charge", charge)
        await asyncio.sleep(5)  # cut off here
        return "unreachable"

    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute(PAYLOAD, place, timeout=1.2)
    assert store.answered == [Stepped.RECORDED], "the cutoff cancelled the step's write"
    record = await record_of(store, manager.key_for(PAYLOAD), manager.options.clock())
    assert steps_of(record) == [["charge", "ch_1"]]


async def test_a_caller_cancelled_during_a_step_write_gets_it_recorded_first() -> None:
    store = SlowStepWrites(0.2)
    events = Events()
    manager = Manager(store, Options(key_prefix="steps", on_event=events))
    writing = asyncio.Event()

    async def charge() -> str:
        asyncio.get_running_loop().call_soon(writing.set)
        return "ch_1"

    async def place() -> Any:
        await step("charge", charge)
        return "done"

    task = asyncio.create_task(manager.execute(PAYLOAD, place, timeout=10))
    await writing.wait()
    await asyncio.sleep(0.05)  # the write is in flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.answered == [Stepped.RECORDED]
    record = await record_of(store, manager.key_for(PAYLOAD), manager.options.clock())
    assert record is not None and record.owner is not None, "released after a cancellation"
    assert steps_of(record) == [["charge", "ch_1"]]
    assert events.count("step_recorded") == 1 and events.count("released") == 0


@pytest.mark.parametrize("fault", ["write failed", "lease lost"])
async def test_no_step_runs_after_a_caught_unrecorded_step(clock: Clock, fault: str) -> None:
    # The callback catches the first step's failed write and goes on: the next step's
    # function must not run (its recovery point could never be recorded), and nothing
    # may claim that another worker took the key when none did.
    store = FailingStepWrites()
    events = Events()
    manager = manager_for(store, clock, on_event=events)
    effects = Effects()
    key = manager.key_for(PAYLOAD)
    assert key is not None
    if fault == "write failed":
        store.fail.add(0)

    async def first() -> str:
        if fault == "lease lost":
            clock.advance(31)
            await store.claim(Claim(key, "other-worker", clock.now, 30.0, 3600.0, None))
        return "a"

    async def place() -> Any:
        with contextlib.suppress(errors.StepNotRecordedError, errors.LeaseLostError):
            await step("a", first)
        return await step("b", effects.fn("b"))

    with pytest.raises(errors.ConfigError, match="was not recorded"):
        await manager.execute(PAYLOAD, place, timeout=30)
    assert not effects.runs, "a step ran that could never be recorded"
    assert events.count("released") == 0
    assert events.count("lease_lost") == (1 if fault == "lease lost" else 0)
    record = await the_record(store, manager, clock)
    assert record.owner is not None and record.steps is None


async def test_a_step_write_that_never_answers_is_given_up_at_the_lease_end() -> None:
    store = SlowStepWrites(3600)
    events = Events()
    manager = Manager(store, Options(key_prefix="steps", completion_reserve=0.3, on_event=events))
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def place() -> Any:
        return await step("charge", _returning("ch_1"))

    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute(PAYLOAD, place, timeout=0.8)
    took = loop.time() - started
    assert 0.7 <= took < 2.0, took  # held past the cutoff (0.5 s), to the lease end
    assert store.answered == []
    record = await record_of(store, manager.key_for(PAYLOAD), manager.options.clock())
    assert record is not None and record.owner is not None, "released with a write unanswered"
    assert events.count("released") == 0 and events.count("step_recorded") == 0


# -- with telemetry: the timing wrapper passes step writes on ----------------------------


@pytest.mark.parametrize("capable", [True, False], ids=["memory", "without record_step"])
async def test_steps_under_telemetry(clock: Clock, capable: bool) -> None:
    pytest.importorskip("opentelemetry")
    from idempotency_async.otel import Telemetry

    store: Any = MemoryStore() if capable else NoSteps()
    manager = manager_for(store, clock, telemetry=Telemetry())
    effects = Effects()
    fail = [True]

    async def place() -> list[Any]:
        done = await effects.take("create")
        if fail[0]:
            raise Boom
        return done

    if not capable:
        with pytest.raises(errors.ConfigError, match="does not record steps"):
            await manager.execute(PAYLOAD, place, timeout=10)
        assert not effects.runs
        return
    with pytest.raises(Boom):
        await manager.execute(PAYLOAD, place, timeout=10)
    fail[0] = False
    assert await manager.execute(PAYLOAD, place, timeout=10) == [{"step": "create"}]
    assert effects.runs == {"create": 1}


@pytest.mark.parametrize("surrogate", [False, True], ids=["wide only", "with a surrogate"])
async def test_a_wide_integer_result_replays_exact(
    store: MemoryStore, clock: Clock, surrogate: bool
) -> None:
    # Beyond 64 bits, as responses: the resumed step list must not read it as a float.
    manager = manager_for(store, clock)
    values: list[Any] = [2**70, {"n": -(2**64)}, [2**63, 1.5]]
    if surrogate:
        values.append("\ud800")
    got: list[Any] = []
    fail = [True]

    async def place() -> str:
        for n, value in enumerate(values):
            got.append(await step(f"s{n}", _returning_raw(value)))
        if fail[0]:
            raise Boom
        return "ok"

    with pytest.raises(Boom):
        await manager.execute(PAYLOAD, place, timeout=10)
    fail[0] = False
    got.clear()
    assert await manager.execute(PAYLOAD, place, timeout=10) == "ok"
    assert got == values
    assert type(got[0]) is int and type(got[1]["n"]) is int and type(got[2][0]) is int


def _returning_raw(value: Any) -> Callable[[], Awaitable[Any]]:
    async def fn() -> Any:
        return value

    return fn


@pytest.mark.parametrize("bound", ["manager", "store"])
async def test_a_step_list_too_full_for_even_the_not_stored_mark_is_not_recorded(
    clock: Clock, bound: str
) -> None:
    # The first step fills the list: the second cannot be recorded even without its
    # result.  No lease was lost; the key is left to its lease, as for a failed write.
    store: MemoryStore = MemoryStore(max_response_bytes=1000)
    first = "x" * 980
    if bound == "store":
        store = BoundedLower()  # refuses lists past 200 characters itself
        first = "x" * 170
    events = Events()
    manager = manager_for(store, clock, on_event=events)
    effects = Effects()

    async def place() -> Any:
        await step("a", effects.fn("a", first))
        await step("b", effects.fn("b", "y" * 100))
        return "ok"

    with pytest.raises(errors.StepNotRecordedError, match="step list is full") as caught:
        await manager.execute(PAYLOAD, place, timeout=30)
    assert caught.value.result == "y" * 100 and not caught.value.outcome_unknown
    assert events.count("lease_lost") == 0 and events.count("released") == 0
    record = await the_record(store, manager, clock)
    assert record.owner is not None and steps_of(record) == [["a", first]]


# -- in a caller's transaction: steps run, nothing recorded (PostgreSQL) ----------------


@pytest.mark.postgres
async def test_steps_in_a_transaction_run_unrecorded_and_scope_downstream_keys(
    postgres_server: Any,
) -> None:
    from _postgres import fresh_table_name

    from idempotency_async.stores.postgres import PostgresStore, create_table

    pool = await postgres_server.pool(max_size=4)
    try:
        table = fresh_table_name()
        await create_table(pool, table=table)
        store = PostgresStore(pool, table=table)
        manager = Manager(store, Options(key_prefix="steps-tx"))
        effects = Effects()
        keys: list[str] = []

        async def charge() -> str:
            keys.append(downstream_key("charge"))
            effects.runs["charge"] += 1
            return "ch_1"

        async def place() -> str:
            return await step("charge", charge)

        async with pool.acquire() as conn, conn.transaction():
            assert await manager.execute_in_transaction(conn, PAYLOAD, place) == "ch_1"
        key = manager.key_for(PAYLOAD)
        assert key is not None
        assert keys == [_in_step_key(key, "charge", "charge")]
        assert effects.runs == {"charge": 1}
        record = await record_of(store, key, manager.options.clock())
        assert record is not None and record.status is Status.COMPLETED
        assert record.steps is None
    finally:
        await pool.close()


# -- a property: any sequence of failures, each step's function runs once -------------


@settings(max_examples=60)
@given(
    steps=st.integers(min_value=1, max_value=6),
    attempts=st.lists(
        st.tuples(st.sampled_from(["raise", "crash", "inside"]), st.integers(0, 6)),
        max_size=6,
    ),
)
def test_any_sequence_of_failures_runs_each_step_once(
    steps: int, attempts: list[tuple[str, int]]
) -> None:
    """Runs that raise after k steps, crash after k steps (no store write: the lease must
    end first), or raise inside step k's function, then a run that finishes: each step's
    function ran exactly once — but a step whose function raised, which ran again — and
    the result is the same for every later call."""

    async def scenario() -> None:
        store, clock = MemoryStore(), Clock()
        effects = Effects()
        names = [f"s{n}" for n in range(steps)]
        plan: list[tuple[str, int] | None] = [*attempts, None]
        raised_inside: Counter[str] = Counter()

        for attempt in plan:
            manager = manager_for(store, clock)  # each attempt another process
            how, k = attempt if attempt is not None else ("finish", steps)
            k = min(k, steps)

            async def failing(name: str) -> Any:
                effects.runs[name] += 1
                raised_inside[name] += 1
                raise Boom

            async def place(how: str = how, k: int = k) -> list[Any]:
                done = []
                for n, name in enumerate(names):
                    if n == k and how in ("raise", "crash"):
                        if how == "crash":
                            await asyncio.sleep(3600)
                        raise Boom
                    if how == "inside" and n == k:
                        fn = functools.partial(failing, name)  # runs unless recorded
                    else:
                        fn = effects.fn(name)
                    done.append(await step(name, fn))
                return done

            task = asyncio.create_task(manager.execute(PAYLOAD, place, timeout=30))
            if how == "crash":
                for _ in range(20):
                    await asyncio.sleep(0)
                task.cancel()
            try:
                result = await task
            except (Boom, asyncio.CancelledError):
                clock.advance(31 if how == "crash" else 0)
                continue
            assert result == [{"step": name} for name in names]
        expected = Counter({name: 1 + raised_inside[name] for name in names})
        assert effects.runs == expected, (attempts, effects.runs)
        replayed = await manager_for(store, clock).execute(PAYLOAD, place, timeout=30)
        assert replayed == [{"step": name} for name in names]
        assert effects.runs == expected

    asyncio.run(scenario())
