"""The shared-timer cutoffs behind every deadline-bound callback."""

from __future__ import annotations

import asyncio

import pytest

from idempotency_async import Manager, MemoryStore, Options
from idempotency_async._cutoff import Cutoffs
from idempotency_async.testing._vloop import VirtualClockLoop


async def _cut(cutoffs: Cutoffs, delay: float, work: float) -> str:
    loop = asyncio.get_running_loop()
    cutoff = cutoffs.at(loop.time() + delay)
    try:
        await asyncio.sleep(work)
        return "finished"
    except asyncio.CancelledError:
        if cutoff.fired():
            return "cut off"
        raise
    finally:
        cutoff.close()


def test_each_task_is_cut_off_at_its_own_time() -> None:
    # On a virtual clock, so the times are exact: on the wall clock a loaded machine delays
    # each wake-up by an unknown amount, and a bound loose enough for that is loose enough
    # to let a late cutoff through.
    loop = VirtualClockLoop()
    finished: dict[str, float] = {}

    async def race() -> list[str]:
        cutoffs = Cutoffs(loop)

        async def timed(name: str, delay: float, work: float) -> str:
            outcome = await _cut(cutoffs, delay, work)
            finished[name] = loop.time()
            return outcome

        # Started latest-first, so the shared timer must be re-armed for earlier cutoffs.
        return await asyncio.gather(
            timed("late", 0.30, 1.0),
            timed("quick", 0.20, 0.01),
            timed("early", 0.10, 1.0),
        )

    try:
        results = loop.run_until_complete(race())
    finally:
        loop.close()
    assert results == ["cut off", "finished", "cut off"]
    assert finished == {"early": 0.10, "quick": 0.01, "late": 0.30}


async def test_closed_cutoffs_do_not_pile_up() -> None:
    cutoffs = Cutoffs(asyncio.get_running_loop())
    results = await asyncio.gather(*(_cut(cutoffs, 60, 0) for _ in range(2000)))
    assert results == ["finished"] * 2000
    assert len(cutoffs._heap) < 600


async def test_an_outside_cancellation_is_not_taken_for_the_cutoff() -> None:
    cutoffs = Cutoffs(asyncio.get_running_loop())
    task = asyncio.create_task(_cut(cutoffs, 60, 10))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_manager_used_on_two_event_loops_cuts_off_on_each() -> None:
    manager = Manager(MemoryStore(), Options(key_prefix="loops"))

    async def hang() -> None:
        await asyncio.sleep(10)

    async def call(n: int) -> None:
        with pytest.raises(TimeoutError):
            await manager.execute({"n": n}, hang, timeout=0.1)

    asyncio.run(call(1))
    asyncio.run(call(2))


def test_a_postponed_cutoff_fires_at_its_new_time_only() -> None:
    # A renewed lease moves the cutoff later; the earlier heap entry must not fire it.
    loop = VirtualClockLoop()
    finished: dict[str, float] = {}

    async def race() -> list[str]:
        cutoffs = Cutoffs(loop)

        async def postponed() -> str:
            cutoff = cutoffs.at(loop.time() + 0.10)
            try:
                await asyncio.sleep(0.05)
                cutoffs.postpone(cutoff, loop.time() + 0.20)  # now ends at 0.25
                cutoffs.postpone(cutoff, loop.time() + 0.10)  # earlier: ignored
                await asyncio.sleep(1.0)
                return "finished"
            except asyncio.CancelledError:
                if cutoff.fired():
                    return "cut off"
                raise
            finally:
                cutoff.close()
                finished["postponed"] = loop.time()

        async def other() -> str:
            outcome = await _cut(cutoffs, 0.15, 1.0)
            finished["other"] = loop.time()
            return outcome

        return await asyncio.gather(postponed(), other())

    try:
        results = loop.run_until_complete(race())
    finally:
        loop.close()
    assert results == ["cut off", "cut off"]
    assert finished == {"other": 0.15, "postponed": 0.25}


def test_a_reopened_cutoff_fires_at_its_new_time_and_counts_as_open() -> None:
    # The completion write reuses the callback's closed cutoff: queued for the earlier
    # time, it must fire at the later one only, once; one that fired gets a new entry.
    loop = VirtualClockLoop()
    finished: dict[str, float] = {}

    async def scenario() -> list[str]:
        cutoffs = Cutoffs(loop)

        async def reopened() -> str:
            first = cutoffs.at(loop.time() + 0.10)
            await asyncio.sleep(0.05)
            first.close()
            second = first.reopen(loop.time() + 0.20)  # until 0.25
            assert second is first and not second.closed and cutoffs.closed_in_heap == 0
            try:
                await asyncio.sleep(1.0)
                return "finished"
            except asyncio.CancelledError:
                if second.fired():
                    return "cut off"
                raise
            finally:
                second.close()
                finished["reopened"] = loop.time()

        async def after_firing() -> str:
            first = cutoffs.at(loop.time() + 0.05)
            try:
                await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                assert first.fired()
            first.close()
            second = first.reopen(loop.time() + 0.10)  # fired: no longer queued
            assert second is not first
            try:
                await asyncio.sleep(1.0)
                return "finished"
            except asyncio.CancelledError:
                if second.fired():
                    return "cut off"
                raise
            finally:
                second.close()
                finished["after firing"] = loop.time()

        return await asyncio.gather(reopened(), after_firing())

    try:
        results = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert results == ["cut off", "cut off"]
    assert finished == pytest.approx({"reopened": 0.25, "after firing": 0.15})


def test_cutoffs_due_at_the_same_instant_both_fire() -> None:
    # Heap entries are (when, cutoff): a tie on ``when`` compares the cutoffs themselves.
    loop = VirtualClockLoop()

    async def tied() -> list[str]:
        cutoffs = Cutoffs(loop)
        when = loop.time() + 0.25

        async def at(work: float) -> str:
            cutoff = cutoffs.at(when)
            try:
                await asyncio.sleep(work)
                return "finished"
            except asyncio.CancelledError:
                if cutoff.fired():
                    return "cut off"
                raise
            finally:
                cutoff.close()

        return await asyncio.gather(at(1.0), at(1.0), at(0.01))

    try:
        assert loop.run_until_complete(tied()) == ["cut off", "cut off", "finished"]
    finally:
        loop.close()


async def _unwinds_slowly(cutoffs: Cutoffs, seen: list[str]) -> str:
    """Work cut off while it answers its first cancellation by waiting (as a database
    driver waits for its server to confirm a cancelled statement)."""
    loop = asyncio.get_running_loop()
    cutoff = cutoffs.insist(loop.time() + 0.01)
    try:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("first")
            await asyncio.sleep(10)  # waiting for the server: the second cancellation
            seen.append("not insisted")
        return "finished"
    except asyncio.CancelledError:
        seen.append("second")
        if cutoff.fired():
            return "cut off"
        raise
    finally:
        cutoff.close()


async def test_an_insisting_cutoff_cancels_work_that_unwinds_slowly_a_second_time() -> None:
    cutoffs = Cutoffs(asyncio.get_running_loop())
    seen: list[str] = []
    task = asyncio.create_task(_unwinds_slowly(cutoffs, seen))
    assert await task == "cut off"
    assert seen == ["first", "second"]
    assert task.cancelling() == 0  # both cancellations consumed


async def test_an_insisting_cutoff_leaves_work_that_ends_at_once_alone() -> None:
    loop = asyncio.get_running_loop()
    cutoffs = Cutoffs(loop)
    after: list[str] = []

    async def quick() -> str:
        cutoff = cutoffs.insist(loop.time() + 0.01)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            assert cutoff.fired()
        finally:
            cutoff.close()
        await asyncio.sleep(0.05)  # the second cancellation must not land here
        after.append("slept")
        return "done"

    task = asyncio.create_task(quick())
    assert await task == "done"
    assert after == ["slept"] and task.cancelling() == 0


async def test_an_outside_cancellation_is_not_taken_for_an_insisting_cutoff() -> None:
    cutoffs = Cutoffs(asyncio.get_running_loop())
    seen: list[str] = []
    task = asyncio.create_task(_unwinds_slowly(cutoffs, seen))
    await asyncio.sleep(0.005)
    task.cancel()  # the caller, before the cutoff: its cancellation wins
    with pytest.raises(asyncio.CancelledError):
        await task
