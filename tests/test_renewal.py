"""Lease renewal (Options(renewal=Renewal(lease=..., every=...))) on every store: a short lease
renewed through the owner-fenced extend while the callback runs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from support import RecordingStore, on_stores, record_of

from idempotency_async import Event, Manager, MemoryStore, Options, Renewal, errors
from idempotency_async.record import Claim, Status
from idempotency_async.stores.base import Extended, Store
from idempotency_async.testing._vloop import VirtualClockLoop

RENEW = 1.0  # the short lease, seconds
EVERY = 0.25  # between renewals


def make(store: Any, **options: Any) -> Manager:
    options.setdefault("key_prefix", "renew")
    return Manager(store, Options(**options))


def renewing(store: Any, **options: Any) -> Manager:
    return make(store, renewal=Renewal(lease=RENEW, every=EVERY), **options)


class Extends(RecordingStore):
    """Records the claim of every extend it passes on, and when it was sent."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.extends: list[tuple[float, Claim]] = []

    async def extend(self, claim: Claim) -> Extended:
        self.extends.append((asyncio.get_running_loop().time(), claim))
        return await super().extend(claim)


@on_stores("memory", "dynamodb", "postgres")
async def test_renewal_holds_the_key_past_several_short_leases(store: Store) -> None:
    recording = Extends(store)
    manager = renewing(recording)
    other = make(store)
    loop = asyncio.get_running_loop()
    started = loop.time()
    probed = asyncio.Event()
    answers: list[type[BaseException]] = []

    async def long() -> str:
        # Past three short leases, a duplicate still finds the key in progress.
        await asyncio.sleep(3 * RENEW)
        for _ in range(2):
            try:
                await other.execute({"id": 1}, _never, timeout=5)
            except errors.IdempotencyError as exc:
                answers.append(type(exc))
            await asyncio.sleep(0.5 * RENEW)
        probed.set()
        return "long"

    assert await manager.execute({"id": 1}, long, timeout=30) == "long"
    assert probed.is_set()
    assert answers == [errors.AlreadyInProgressError, errors.AlreadyInProgressError]
    assert loop.time() - started >= 4 * RENEW
    assert len(recording.extends) >= 8  # one round trip per interval
    # Every renewal asks for the short lease, not the deadline.
    assert all(claim.lease <= RENEW for _, claim in recording.extends)
    key = manager.key_for({"id": 1})
    assert (await store.get(key, now=manager.options.clock())).record.status is Status.COMPLETED  # type: ignore[union-attr]


async def _never() -> str:
    raise AssertionError("a duplicate ran while the key was held")


async def test_a_refused_renewal_cuts_the_callback_off_at_once(store: Store) -> None:
    events: list[Event] = []
    manager = renewing(store, on_event=events.append)
    key = manager.key_for({"id": 2})
    loop = asyncio.get_running_loop()
    stolen_at: list[float] = []

    async def long() -> str:
        await asyncio.sleep(EVERY / 2)
        # Another worker's operator frees the key: the next renewal is refused.
        await store.force_release(key)
        stolen_at.append(loop.time())
        await asyncio.sleep(30)
        return "never"

    with pytest.raises(errors.DeadlineExceededError, match="refused to renew"):
        await manager.execute({"id": 2}, long, timeout=30)
    # Cut off at the first renewal after the theft, well before the short lease ended.
    assert loop.time() - stolen_at[0] < RENEW
    # A busy server may leave an earlier renewal unanswered past its interval (abandoned:
    # renew_failed); the refusal is what must cut the callback off.
    kinds = [e.kind for e in events if e.kind != "renew_failed"]
    assert kinds == ["claimed", "lease_lost", "cut_off"]
    assert (await store.get(key, now=manager.options.clock())).record is None


@on_stores("memory", "dynamodb", "postgres")
@pytest.mark.parametrize("fault", ["raises", "slow"])
async def test_an_unconfirmed_renewal_cuts_the_callback_off_before_the_lease_ends(
    store: Store, fault: str
) -> None:
    recording = RecordingStore(store)
    if fault == "raises":
        recording.fail_on["extend"] = errors.StoreUnavailableError("extend failed (injected)")
    else:
        recording.delay["extend"] = 30.0
    events: list[Event] = []
    manager = renewing(recording, on_event=events.append)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute({"id": 3}, _sleeps(30), timeout=30)
    elapsed = loop.time() - started
    assert elapsed < RENEW  # a reserve before the short lease ends, not the deadline
    assert recording.calls.count("extend") >= 1
    assert events[-1].kind == "cut_off"
    if fault == "raises":
        assert "renew_failed" in [e.kind for e in events]
    # Nobody renews it now: the key is free once the short lease ends.
    await asyncio.sleep(RENEW - elapsed + 0.1)
    assert await make(store).execute({"id": 3}, _returns("next"), timeout=5) == "next"


@on_stores("memory", "dynamodb", "postgres")
async def test_the_renewing_task_ends_with_a_cancelled_caller(store: Store) -> None:
    recording = Extends(store)
    manager = renewing(recording)
    loop = asyncio.get_running_loop()
    call = asyncio.create_task(manager.execute({"id": 4}, _sleeps(30), timeout=30))
    await asyncio.sleep(2.5 * EVERY)  # mid-renewal
    call.cancel()
    cancelled_at = loop.time()
    with pytest.raises(asyncio.CancelledError):
        await call
    renewals = len(recording.extends)
    assert renewals >= 1
    # No task left behind, and no extend sent after the cancellation.
    assert asyncio.all_tasks() == {asyncio.current_task()}
    await asyncio.sleep(3 * EVERY)
    assert len(recording.extends) == renewals
    assert all(sent <= cancelled_at for sent, _ in recording.extends)
    # The abandoned record is freed within one short lease of the last renewal, not at
    # the 30 s deadline.
    last = recording.extends[-1][0]
    await asyncio.sleep(max(0.0, last + RENEW + 0.1 - loop.time()))
    assert await make(store).execute({"id": 4}, _returns("next"), timeout=5) == "next"


@on_stores("memory", "dynamodb", "postgres")
async def test_the_lease_never_outlasts_the_deadline(store: Store) -> None:
    recording = Extends(store)
    manager = renewing(recording)
    clock = manager.options.clock
    loop = asyncio.get_running_loop()
    wall_deadline = clock() + 1.6
    started = loop.time()
    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute({"id": 5}, _sleeps(30), timeout=1.6)
    assert loop.time() - started < 1.6
    assert recording.extends  # renewed up to the deadline ...
    for _, claim in recording.extends:  # ... never past it
        assert claim.now + claim.lease <= wall_deadline + 0.05


@on_stores("memory", "dynamodb", "postgres")
async def test_without_a_deadline_the_lease_option_bounds_a_renewed_callback(
    store: Store,
) -> None:
    recording = Extends(store)
    manager = renewing(recording, lease=1.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(errors.DeadlineExceededError):
        await manager.execute({"id": 6}, _sleeps(30))
    assert 1.0 < loop.time() - started < 1.5
    assert recording.extends


async def test_a_short_call_sends_no_renewal(store: Store) -> None:
    recording = RecordingStore(store)
    manager = renewing(recording)
    assert await manager.execute({"id": 7}, _returns("quick"), timeout=30) == "quick"
    assert recording.calls == ["claim", "complete"]
    assert asyncio.all_tasks() == {asyncio.current_task()}


@pytest.mark.parametrize(
    "settings",
    [
        {"lease": 0},
        {"lease": float("nan")},
        {"lease": 10.0, "every": 10.0},
        {"lease": 10.0, "every": -1.0},
    ],
)
def test_bad_renewal_settings_are_config_errors(settings: dict[str, Any]) -> None:
    with pytest.raises(errors.ConfigError, match=r"Renewal\((lease|every)=\.\.\.\)"):
        Renewal(**settings)


def _renewing(lease: float, every: float | None = None, **options: Any) -> Options:
    return Options(renewal=Renewal(lease=lease, every=every), **options)


def _sleeps(seconds: float) -> Any:
    async def sleeps() -> str:
        await asyncio.sleep(seconds)
        return "slept"

    return sleeps


def _returns(value: str) -> Any:
    async def returns() -> str:
        return value

    return returns


# -- regressions the simulator found ----------------------------------------------------


async def test_a_callback_that_swallows_a_refused_renewal_gets_lease_lost() -> None:
    # The refused renewal cuts the callback off once; its cutoff's own timer must not
    # cancel the caller a second time (the caller would get a CancelledError).
    store = MemoryStore()
    manager = renewing(store)
    key = manager.key_for({"id": 8})

    async def swallows() -> str:
        await asyncio.sleep(EVERY / 2)
        await store.force_release(key)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(RENEW)  # past the cutoff's earlier heap entries
        return "swallowed"

    with pytest.raises(errors.LeaseLostError) as lost:
        await manager.execute({"id": 8}, swallows, timeout=30)
    assert lost.value.result == "swallowed"


async def test_a_callback_that_returns_after_blocking_past_its_cutoff_is_recorded() -> None:
    # The renewing task is cancelled without yielding to the loop: the overdue cutoff must
    # not undo a callback that has returned.
    store = MemoryStore()
    manager = renewing(store)

    async def blocks() -> str:
        time.sleep(RENEW * 1.2)  # noqa: ASYNC251 - blocks the loop past the short lease
        return "blocked"

    assert await manager.execute({"id": 9}, blocks, timeout=30) == "blocked"
    record = await record_of(store, manager.key_for({"id": 9}), now=manager.options.clock())
    assert record is not None and record.status is Status.COMPLETED


# -- issue 32: bounded extends, settings that can renew, the first renewal's timing ------


class _Virtual:
    """A manager on a virtual-time loop: exact times, no real waiting (MemoryStore)."""

    def __init__(self) -> None:
        self.loop = VirtualClockLoop()
        self.base = 1_700_000_000.0

    def clock(self) -> float:
        return self.base + self.loop.time()

    def run(self, coroutine: Any) -> Any:
        try:
            return self.loop.run_until_complete(coroutine)
        finally:
            self.loop.close()


class _Timed(Extends):
    """Extends whose ``n``-th request (0-based) stalls for ``stall`` seconds before it
    reaches the store — it never does if its sender gives up first, unless ``lands`` (it
    was on the wire: the store applies it late all the same); the claim takes
    ``claim_takes`` to be answered."""

    def __init__(
        self, inner: Store, *, stall_nth: int = -1, stall: float = 0.0, lands: bool = False
    ) -> None:
        super().__init__(inner)
        self.stall_nth, self.stall, self.lands = stall_nth, stall, lands
        self.answers: list[tuple[float, Extended]] = []
        self.claim_takes = 0.0
        self.landing: list[asyncio.Task[Extended]] = []

    async def claim(self, claim: Claim) -> Any:
        answer = await super().claim(claim)
        await asyncio.sleep(self.claim_takes)  # written at once, answered late
        return answer

    async def extend(self, claim: Claim) -> Extended:
        nth = len(self.extends)
        self.extends.append((asyncio.get_running_loop().time(), claim))
        if nth == self.stall_nth and self.lands:
            landing = asyncio.create_task(self._land(claim))
            self.landing.append(landing)  # awaited by the test
            return await asyncio.shield(landing)
        if nth == self.stall_nth:
            await asyncio.sleep(self.stall)
        answer = await self.inner.extend(claim)
        self.answers.append((asyncio.get_running_loop().time(), answer))
        return answer

    async def _land(self, claim: Claim) -> Extended:
        await asyncio.sleep(self.stall)
        answer = await self.inner.extend(claim)
        self.answers.append((asyncio.get_running_loop().time(), answer))
        return answer


def test_an_unanswered_renewal_is_abandoned_and_the_next_goes_out_on_time() -> None:
    # The first extend never answers within the call; every later one does.  Awaited
    # without a bound, it stopped every renewal and a healthy call was cut off at 0.8 s.
    virtual = _Virtual()
    store = _Timed(MemoryStore(), stall_nth=0, stall=30.0)
    events: list[Event] = []
    manager = renewing(store, clock=virtual.clock, on_event=events.append)

    async def scenario() -> str:
        started = virtual.loop.time()
        result = await manager.execute({"id": 10}, _sleeps(5.0), timeout=30)
        assert virtual.loop.time() - started == pytest.approx(5.0)
        return str(result)

    assert virtual.run(scenario()) == "slept"
    sent = [at for at, _ in store.extends]
    # One every interval from the claim, the stalled one abandoned at the second's send.
    assert sent[:3] == pytest.approx([EVERY, 2 * EVERY, 3 * EVERY])
    assert len(sent) == pytest.approx(5.0 / EVERY, abs=1)
    assert [e.kind for e in events].count("renew_failed") == 1
    failed = next(e for e in events if e.kind == "renew_failed")
    assert isinstance(failed.error, TimeoutError)
    # The abandoned request never reached the store (cancelled while stalled).
    assert len(store.answers) == len(sent) - 1


def test_an_abandoned_renewal_that_lands_late_does_not_shorten_the_lease() -> None:
    # The stalled extend reaches the store after newer ones: the store keeps the later
    # lease end (ALREADY_LATER), so no other worker can claim while the call runs.
    virtual = _Virtual()
    inner = MemoryStore()
    store = _Timed(inner, stall_nth=0, stall=1.05, lands=True)
    manager = renewing(store, clock=virtual.clock)
    other = make(inner, clock=virtual.clock)
    answers: list[object] = []

    async def holds() -> str:
        # The renewal sent at 0.25 asks for a lease to 1.25 and lands at 1.3, after the
        # ones sent at 0.5 ... 1.25 (lease to 2.25).  Overwriting, it would end the lease
        # in the past: another worker probing before the next renewal (1.5) would run.
        await asyncio.sleep(1.35)
        for _ in range(3):
            try:
                await other.execute({"id": 11}, _never, timeout=5)
            except errors.AlreadyInProgressError:
                answers.append("in progress")
            await asyncio.sleep(0.05)
        return "held"

    async def scenario() -> str:
        result = str(await manager.execute({"id": 11}, holds, timeout=30))
        await asyncio.gather(*store.landing)
        return result

    assert virtual.run(scenario()) == "held"
    assert answers == ["in progress"] * 3
    late = [answer for at, answer in store.answers if at == pytest.approx(1.3)]
    assert late == [Extended.ALREADY_LATER]


@pytest.mark.parametrize(
    ("claim_takes", "first"),
    [(0.0, EVERY), (0.2, EVERY), (0.4, 0.4)],  # a slow claim answer: the first goes at once
)
def test_the_first_renewal_counts_from_the_claims_send(claim_takes: float, first: float) -> None:
    virtual = _Virtual()
    store = _Timed(MemoryStore())
    store.claim_takes = claim_takes
    manager = renewing(store, clock=virtual.clock)

    async def scenario() -> None:
        await manager.execute({"id": 12}, _sleeps(0.8), timeout=30)

    virtual.run(scenario())
    assert store.extends[0][0] == pytest.approx(first)


@pytest.mark.parametrize(
    ("settings", "advice"),
    [
        # The first renewal comes after the cutoff (a reserve before the short lease).
        ({"lease": 1.0, "every": 0.9}, "every"),
        # Cut off at the claim: the reserve is the whole short lease.
        ({"lease": 1.0, "completion_reserve": 1.0}, "completion_reserve"),
        # One lost renewal is not survived: the next is due after the cutoff.
        ({"lease": 1.0, "every": 0.45}, "every"),
        ({"lease": 30.0, "every": 15.0}, "every"),
        # No room for the renewal's round trip after one is lost.
        ({"lease": 1.0, "every": 0.4}, "every"),
        ({"lease": 2.0, "completion_reserve": 0.6}, "completion_reserve"),
    ],
)
def test_renewal_settings_that_cannot_renew_are_config_errors(
    settings: dict[str, Any], advice: str
) -> None:
    with pytest.raises(errors.ConfigError, match="cannot survive a lost renewal") as refused:
        _renewing(**settings)
    message = str(refused.value)
    named = "completion_reserve" if advice == "completion_reserve" else f"renewal.{advice}"
    assert f"{named} to at most" in message and "renewal.lease to at least" in message
    assert message.startswith("renewal=Renewal(lease=")
    # What it advises is accepted.
    at_most = float(message.split(f"{named} to at most ")[1].split(" s")[0])
    options = _renewing(**{**settings, advice: at_most})
    assert options.renewal == Renewal(lease=settings["lease"], every=options.renewal.every)
    at_least = float(message.split("renewal.lease to at least ")[1].split(" s")[0])
    assert _renewing(**{**settings, "lease": at_least}).renewal.lease == at_least  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "settings",
    [
        {"lease": 1.0},  # a third of it, and a reserve of 0.2 s
        {"lease": RENEW, "every": EVERY},
        {"lease": 30.0, "every": 10.0},
        {"lease": 30.0, "every": 13.0},
        {"lease": 5.0, "completion_reserve": 1.0},
        {"lease": 1.0, "every": 0.3, "completion_reserve": 0.2},
    ],
)
def test_renewal_settings_that_survive_a_lost_renewal_are_accepted(
    settings: dict[str, Any],
) -> None:
    assert _renewing(**settings).renewal.lease == settings["lease"]  # type: ignore[union-attr]


# -- a renewal that lands while the callback's own completion is on its way ---------------


class _SlowCompletion(_Timed):
    """``_Timed``, whose completions reach the store ``takes`` seconds after they are sent."""

    def __init__(self, inner: Store, takes: float, **timed: Any) -> None:
        super().__init__(inner, **timed)
        self.takes = takes
        self.completed_at: list[float] = []

    async def complete(self, completion: Any) -> Any:
        await asyncio.sleep(self.takes)
        self.completed_at.append(asyncio.get_running_loop().time())
        return await self.inner.complete(completion)


def test_a_renewal_confirmed_after_call_complete_was_sent_moves_its_bound() -> None:
    # Found by the simulator (seed 70984, shrunk).  The renewal sent at 0.25 is answered
    # at 0.45, moving the lease end from 1.0 to 1.25; the callback completed at 0.3 (its
    # point of no return, no renewal sent after it), and that write takes 0.85 s.  Bounded
    # at the lease end as known when it was sent (1.0), it was abandoned — CompletionError,
    # a record left in progress — though the store held the lease until 1.25.
    virtual = _Virtual()
    inner = MemoryStore()
    store = _SlowCompletion(inner, takes=0.85, stall_nth=0, stall=0.2)
    manager = renewing(store, clock=virtual.clock)

    async def completes_early(call: Any) -> str:
        await asyncio.sleep(0.3)
        await call.complete("done")
        return "done"

    async def scenario() -> tuple[str, Any]:
        result = await manager.execute_call({"id": 12}, completes_early, timeout=30)
        key = manager.key_for({"id": 12})
        return result, await record_of(inner, key, now=manager.options.clock())

    result, record = virtual.run(scenario())
    assert result == "done"
    assert [at for at, _ in store.extends] == pytest.approx([EVERY])
    assert store.answers[0][0] == pytest.approx(0.45)
    assert store.completed_at == pytest.approx([1.15])
    assert record is not None and record.status is Status.COMPLETED
