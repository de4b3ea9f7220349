"""The fault simulator on the project's stores: MemoryStore on a virtual clock (7,000
scenarios, every pair of axis values and every named triple crossed); DynamoDB on the moto
server and Redis on a real redis-server in real time (client clock, and the server's own
clock).

The generator features that still find an open defect are left out (``_open_defects``);
``test_simulator_regressions.py`` holds the seed of each.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from _coverage_report import record
from _moto import fresh_table
from _open_defects import ADDED_BY_ISSUE_32, DYNAMODB_OPEN, EXCLUDE
from _redis import RedisServer

from idempotency_async import MemoryStore
from idempotency_async.record import Claim, Completion
from idempotency_async.stores.base import Extended, Written
from idempotency_async.stores.dynamodb import DynamoDBStore
from idempotency_async.stores.redis import RedisStore
from idempotency_async.testing import (
    Scenario,
    SimulationFailure,
    generate,
    run_one,
    simulate,
    simulate_live,
)
from idempotency_async.testing.__main__ import main
from idempotency_async.testing._axes import covering_rows

# More seeds locally: SIM_MEMORY_SEEDS=200000 SIM_LIVE_SEEDS=2000 python -m pytest ...
MEMORY_SEEDS = int(os.environ.get("SIM_MEMORY_SEEDS", "7000"))
LIVE_SEEDS = int(os.environ.get("SIM_LIVE_SEEDS", "80"))
REDIS_SEEDS = int(os.environ.get("SIM_REDIS_SEEDS", "70"))


def test_memory_store_keeps_the_guarantee() -> None:
    report = simulate(MemoryStore, range(MEMORY_SEEDS), workers=2, exclude=EXCLUDE)
    record("MemoryStore, virtual time", report)
    assert report.scenarios == MEMORY_SEEDS
    assert report.faults >= MEMORY_SEEDS  # at least one per scenario
    # Features cross: every pair of axis values that can meet did, and every named triple
    # (a feature lands as an axis with its pairs covered).  CI's seeds realize the covering
    # array many times over; a count below twice its rows (a quick local run) may not.
    if 2 * len(covering_rows()) <= MEMORY_SEEDS:
        assert report.coverage.missing_pairs(EXCLUDE) == []
        assert report.coverage.missing_triples(EXCLUDE) == []
    # Every documented outcome shows up, so the checks are not vacuous.
    for outcome in (
        "value",
        "AlreadyInProgressError",
        "LeaseLostError",
        "CompletionError",
        "ResponseNotStoredError",
        "CancelledError",
        "DeadlineExceededError",
        "CallbackFailed",
        "CallbackDeclined",  # a declared error (replay_errors), its own or replayed
        "PayloadValidationError",
        "StoreUnavailableError",
        "ServerError",  # an HTTP endpoint's 5xx
        "RetryLater",  # an HTTP endpoint's (or a route's) 408/425/429, released like a 5xx
        # Steps: a retry whose step differs from the record's, a step result that is not
        # JSON (on its run and every resume), a recovery point whose write failed.
        "StepMismatchError",
        "StepResultNotStoredError",
        "StepNotRecordedError",
    ):
        assert report.outcomes.get(outcome, 0) > 0, outcome


def test_a_failure_shrinks_to_a_scenario_that_reproduces_it() -> None:
    # The unfenced store breaks the guarantee whatever the branch.
    with pytest.raises(SimulationFailure) as caught:
        simulate(_UnfencedStore, range(2000), exclude=EXCLUDE)
    failure = caught.value
    assert failure.shrunk is not None
    assert len(failure.shrunk.calls) <= len(failure.scenario.calls)
    assert len(failure.shrunk.calls) <= 4
    text = str(failure)
    assert "reproduce: python -m idempotency_async.testing --scenario '" in text
    # The printed scenario is the shrunk one, and it round-trips through JSON.
    assert Scenario.from_json(failure.shrunk.to_json()) == failure.shrunk
    assert run_one(failure.shrunk, _UnfencedStore)
    assert not run_one(failure.shrunk, MemoryStore)


def test_the_reproducer_command_runs_the_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = generate(7, exclude=EXCLUDE)
    assert main(["--scenario", scenario.to_json()]) == 0
    assert "the scenario kept the guarantee" in capsys.readouterr().out


class _UnfencedStore(MemoryStore):
    """A store with a classic bug: completion does not check the owner token."""

    async def complete(self, completion: Completion) -> Written:
        current = (await self.get(completion.key, now=completion.now)).record
        if current is not None and current.owner != completion.owner:
            await self.force_release(completion.key)
            await self.claim(Claim(completion.key, completion.owner, completion.now, 1.0, 1.0))
        return await super().complete(completion)


def test_a_store_bug_fails_with_the_seed_and_the_command_to_rerun_it() -> None:
    with pytest.raises(SimulationFailure) as caught:
        simulate(_UnfencedStore, range(2000), exclude=EXCLUDE, shrink=False)
    text = str(caught.value)
    assert f"seed {caught.value.seed} broke the guarantee" in text
    assert "store: completion" in text and "must fence" in text
    assert f"rerun: python -m idempotency_async.testing --seed {caught.value.seed}" in text
    if EXCLUDE:  # open defects' features are left out of the rerun too
        assert "--exclude " + ",".join(EXCLUDE) in text
    else:
        assert "--exclude" not in text
    assert "call 0: CallPlan(" in text  # the scenario itself is printed


@pytest.mark.dynamodb
async def test_dynamodb_store_keeps_the_guarantee_in_real_time(dynamodb_client: Any) -> None:
    table = await fresh_table(dynamodb_client)
    report = await simulate_live(
        lambda: DynamoDBStore(dynamodb_client, table_name=table),
        range(LIVE_SEEDS),
        scale=0.05,
        concurrency=8,
        tolerance=1.0,  # loop lag on a busy machine; the store's behaviour is what counts here
        exclude=EXCLUDE + DYNAMODB_OPEN,
    )
    record("DynamoDBStore (moto), real time", report, pairs=False)
    assert report.scenarios == LIVE_SEEDS


async def test_redis_store_keeps_the_guarantee_in_real_time(redis_server: RedisServer) -> None:
    # Client clock: the simulator moves each manager's clock and judges by the now it sent.
    # A socket timeout, as production clients have: redis-py then sends through
    # asyncio.wait_for, whose lost cancellations (Python 3.11) the store must raise.
    client = redis_server.client(socket_timeout=10.0)
    try:
        report = await simulate_live(
            lambda: RedisStore(client, judged_by="client"),
            range(REDIS_SEEDS),
            scale=0.05,
            concurrency=8,
            tolerance=1.0,
            exclude=EXCLUDE,
        )
    finally:
        await client.aclose()
    record("RedisStore (client clock), real time", report, pairs=False)
    assert report.scenarios == REDIS_SEEDS


async def test_redis_store_keeps_the_guarantee_by_its_server_clock(
    redis_server: RedisServer,
) -> None:
    # The server's clock (TIME) judges leases and expiry; the managers' clocks are skewed
    # and some keep local caches.  The oracle judges by true time.
    client = redis_server.client(socket_timeout=10.0)
    try:
        report = await simulate_live(
            lambda: RedisStore(client),
            range(REDIS_SEEDS),
            scale=0.05,
            concurrency=8,
            tolerance=1.0,
            exclude=EXCLUDE,
            server_clock=True,
        )
    finally:
        await client.aclose()
    record("RedisStore (server clock), real time", report, pairs=False)
    assert report.scenarios == REDIS_SEEDS


class _CountingWakes(RedisStore):
    """A RedisStore counting the waits it watched and the wake-ups that ended one early."""

    watched = 0
    woken = 0

    def watch(self, key: str) -> Any:
        _CountingWakes.watched += 1
        return _CountedWatch(super().watch(key))


class _CountedWatch:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def listening(self) -> bool:
        return bool(self._inner.listening)

    async def wait(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await self._inner.wait(timeout)
        if loop.time() - started < timeout * 0.9:
            _CountingWakes.woken += 1

    def __enter__(self) -> _CountedWatch:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._inner.__exit__(*exc_info)


async def test_redis_store_keeps_the_guarantee_when_waiters_are_woken(
    redis_server: RedisServer,
) -> None:
    # The wait paths with pub/sub wake-ups on (the runs above have them too): every store
    # a scenario opens subscribes for its waiters and is closed after it.
    client = redis_server.client()
    try:
        report = await simulate_live(
            lambda: _CountingWakes(client, judged_by="client"),
            range(REDIS_SEEDS, 2 * REDIS_SEEDS),
            scale=0.05,
            concurrency=8,
            tolerance=1.0,
            exclude=EXCLUDE,
        )
    finally:
        await client.aclose()
    record("RedisStore (client clock, waiters woken), real time", report, pairs=False)
    assert report.scenarios == REDIS_SEEDS
    assert _CountingWakes.watched > 0 and _CountingWakes.woken > 0
    assert [t for t in asyncio.all_tasks() if "wake-ups" in t.get_name()] == []


class _IdleExtendStore(MemoryStore):
    """A store whose extend says yes and does nothing: the lease is not renewed."""

    async def extend(self, claim: Claim) -> Extended:
        record = (await self.get(claim.key, now=claim.now)).record
        held = record is not None and record.owner == claim.owner
        return Extended.RENEWED if held else Extended.LOST


def test_renewal_is_generated_with_faults_on_extend() -> None:
    scenarios = [generate(seed) for seed in range(200)]
    renewing = [s for s in scenarios if any(m.renew_lease is not None for m in s.managers)]
    assert len(renewing) > 50
    kinds = {f.kind for s in renewing for c in s.calls for f in c.faults if f.op == "extend"}
    assert {"error", "lose", "delay", "stall"} <= kinds
    # A feature of its own: left out, no manager renews, and every other draw is the same.
    for seed in range(50):
        scenario = generate(seed, exclude=ADDED_BY_ISSUE_32)
        without = generate(seed, exclude=("renewal", *ADDED_BY_ISSUE_32))
        assert all(m.renew_lease is None for m in without.managers)
        assert [c.at for c in without.calls] == [c.at for c in scenario.calls]


def test_the_oracle_judges_renewals_by_what_the_store_kept() -> None:
    # A confirmed renewal that did not move the lease lets another worker claim while the
    # callback still runs: the oracle must see it (G1), though the manager did its part.
    # A seed that breaks with it and keeps the guarantee on MemoryStore (while renewal
    # defects of the library are open, some seeds break on both: they say nothing here).
    for seed in range(3000):
        scenario = generate(seed, exclude=RENEWING)
        idle = run_one(scenario, _IdleExtendStore)
        if idle and not run_one(scenario, MemoryStore):
            assert any(v.startswith(("G1", "store:")) for v in idle), idle
            return
    pytest.fail("no seed of 3,000 told a store that does not renew from one that does")


# The features of still-open defects but renewal's, and renewal's own open findings: a
# store-side bug in renewal must be found whatever the library's renewal defects.
RENEWING = tuple(sorted(set(EXCLUDE) - {"renewal"} | {"renew_settings", "late_extends"}))
