"""A scenario's processes: one manager each, with its options and its wall clock (skewed,
and jumping once when its plan says so), and the keys the scenario's calls are stored
under."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from idempotency_async._replayed import ReplayErrors
from idempotency_async._stored_redaction import Redaction
from idempotency_async.errors import ConfigError
from idempotency_async.manager import Manager
from idempotency_async.options import LocalCache, Options, Renewal, Wait
from idempotency_async.stores.base import Store
from idempotency_async.testing._plans import REDACTED_FIELD, ManagerPlan, Scenario
from idempotency_async.testing._trace import CallbackDeclined

__all__ = ["clock_offset", "managers_of", "plain_keys"]


def clock_offset(plan: ManagerPlan, loop_time: float) -> float:
    """How far the process's wall clock is ahead of true time at ``loop_time``: its skew,
    plus its jump once the jump happened."""
    if plan.jump_at is not None and loop_time >= plan.jump_at:
        return plan.skew + plan.jump
    return plan.skew


def managers_of(
    scenario: Scenario, store: Store, start: float, base: float, namespace: str
) -> tuple[list[Manager | None], dict[int, BaseException]]:
    """Each process's manager on ``store`` (None where its options were refused) and the
    refusals, by process.  ``start``: the loop time the scenario starts at, which is Unix
    time ``base`` on a clock without skew."""
    managers: list[Manager | None] = []
    refused: dict[int, BaseException] = {}
    for index in range(len(scenario.managers)):
        try:
            managers.append(_manager(scenario, index, store, start, base, namespace))
        except ConfigError as exc:
            managers.append(None)
            refused[index] = exc
    return managers, refused


def plain_keys(scenario: Scenario, store: Store, namespace: str) -> dict[int, str]:
    """The store key of each key index the scenario's calls use, as a plain call (not an
    HTTP request, nor a batch keyed by message) is stored under it."""
    options = _options(scenario, scenario.managers[0], namespace, time.time, keying=True)
    keying = Manager(store, options)
    keys: dict[int, str] = {}
    for call in scenario.calls:
        if call.key is not None and call.key not in keys:
            key = keying.key_for({"id": call.key})
            assert key is not None
            keys[call.key] = key
    return keys


def _options(
    scenario: Scenario, plan: ManagerPlan, namespace: str, clock: Any, keying: bool = False
) -> Options:
    renew = plan.renew_lease
    renewal = None if keying or renew is None else Renewal(lease=renew, every=plan.renew_every)
    return Options(
        key_prefix=f"sim{scenario.seed}{namespace}",
        event_key_jmespath="id",
        payload_validation_jmespath="amount" if scenario.validate else None,
        expires_after=plan.expires_after,
        lease=plan.lease,
        lease_margin=plan.lease_margin,
        completion_reserve=None if keying else plan.completion_reserve,
        renewal=renewal,
        wait=Wait(timeout=plan.wait_timeout) if plan.wait else None,
        local_cache=LocalCache() if plan.use_local_cache else None,
        redaction=_redaction(plan),
        # Every process declares the same deterministic failure (only callbacks planned
        # "declared" raise it); the records are read by this library only.
        replay_errors=_DECLARED,
        clock=clock,
    )


def _redaction(plan: ManagerPlan) -> Redaction | None:
    if plan.redaction == "fields":
        return Redaction(fields=(REDACTED_FIELD,))
    if plan.redaction == "never_store":
        return Redaction(never_store=True)
    return None


_DECLARED = ReplayErrors((CallbackDeclined,), private_records=True)


def _manager(
    scenario: Scenario, index: int, store: Store, start: float, base: float, namespace: str
) -> Manager:
    plan = scenario.managers[index]
    loop = asyncio.get_running_loop()
    offset = base - start

    def clock() -> float:
        now = loop.time()
        return offset + now + clock_offset(plan, now - start)

    return Manager(store, _options(scenario, plan, namespace, clock))
