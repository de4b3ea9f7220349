"""The test kit's engine: each scenario on a loop of its own, judged, a failure shrunk.

On the default ``MemoryStore`` every scenario runs on a fresh virtual-time loop (the
simulator's ``VirtualClockLoop``): leases of an hour pass at once, and a handler waiting for
something nothing will bring is reported as a deadlock instead of hanging the test.  A
store the user supplies runs on an ordinary loop, in real time.  Shrinking reuses the
simulator's ``shrink_live`` with the kit's own candidates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from idempotency_async.stores.base import Store
from idempotency_async.stores.memory import MemoryStore
from idempotency_async.testing._kit_oracle import describe, judge, kind_of, normal
from idempotency_async.testing._kit_run import Effects, Trace, run_scenario
from idempotency_async.testing._kit_scenario import Call, Scenario, candidates
from idempotency_async.testing._kit_step_oracle import is_stepped
from idempotency_async.testing._kit_targets import HttpAnswer, Target
from idempotency_async.testing._kit_variants import differing, same_apart_from
from idempotency_async.testing._shrink import shrink_live
from idempotency_async.testing._vloop import Deadlock, VirtualClockLoop

__all__ = ["Engine", "Failure"]


@dataclass(slots=True)
class Failure:
    scenario: Scenario
    violations: list[str]
    tried: str = ""
    """The name of the generated scenario that first failed."""


@dataclass(slots=True)
class Engine:
    target: Target
    effects: Effects
    make_store: Callable[[], Store] | None = None
    """None: a fresh ``MemoryStore`` per scenario, on virtual time."""
    downstream: bool = False
    """The counter counts a provider's effects, deduplicated by a downstream key."""
    runs: int = 0
    modes: set[str] = field(default_factory=set)
    steps: bool = False
    """The handler takes steps: each scenario marks the counter at every replayed step."""

    @property
    def virtual(self) -> bool:
        return self.make_store is None

    def run(self, scenario: Scenario) -> Trace:
        with _captured() as records:
            trace = self._run(scenario)
        trace.logs = [record.getMessage() for record in records]
        trace.logged_errors = [
            record.exc_info[1] for record in records if record.exc_info and record.exc_info[1]
        ]
        return trace

    def _run(self, scenario: Scenario) -> Trace:
        self.runs += 1
        make_store = self.make_store or MemoryStore
        loop: asyncio.AbstractEventLoop = (
            VirtualClockLoop() if self.virtual else asyncio.new_event_loop()
        )
        settle = 1.0 if self.virtual else 0.05
        try:
            coro = run_scenario(
                self.target,
                scenario,
                self.effects,
                make_store,
                virtual=self.virtual,
                settle=settle,
                step_events=self.steps,
            )
            trace = loop.run_until_complete(coro)
        except Deadlock as exc:
            trace = Trace(scenario, error=exc)
        finally:
            _close(loop)
        trace.downstream = self.downstream
        stepped = " + recovery points" if is_stepped(trace) else ""
        if trace.transactional:
            self.modes.add("transactional")
        elif any(mark.what.startswith("extend") for mark in trace.marks):
            self.modes.add("lease + renewal" + stepped)
        elif any(mark.what == "claimed" for mark in trace.marks):
            self.modes.add(("downstream keys" if self.downstream else "lease") + stepped)
        return trace

    def violations(self, scenario: Scenario) -> list[str]:
        trace = self.run(scenario)
        found = judge(trace)
        if not found and any(call.variant for call in scenario.calls):
            found = self._variant_check(scenario, trace)
        return found

    def _variant_check(self, scenario: Scenario, trace: Trace) -> list[str]:
        """A variant answered with the payload's replay must be answered so alone too."""
        answered = [
            (call.variant, normal(outcome.answer), outcome)
            for call, outcome in zip(scenario.calls, trace.outcomes, strict=True)
            if kind_of(outcome) == "answer"
        ]
        # A variant's answer that is the payload's own, given to an earlier call: a replay.
        replayed = [
            outcome
            for index, (variant, answer, outcome) in enumerate(answered)
            if variant and any(not v and a == answer for v, a, _ in answered[:index])
        ]
        if not replayed:
            return []
        alone = [self._answer(scenario.payload) for _ in range(2)]
        variant = self._answer(scenario.variant)
        if alone[0] is None or alone[1] is None or variant is None:
            return []
        noise = differing(alone[0], alone[1])
        changed = same_apart_from(alone[0], variant, noise)
        if not changed:
            return []
        where = ", ".join(_path(path) for path in sorted(changed, key=repr)[:3])
        return [
            f"key ignores a field: the variant {scenario.variant!r} shares the key of "
            f"{scenario.payload!r} and its duplicate got that payload's answer replayed "
            f"({describe(replayed[0])}), but sent alone it is answered differently at {where} "
            "(put the field in the key expression, or in payload validation)"
        ]

    def _answer(self, payload: Any) -> Any:
        outcome = self.run(Scenario(payload, (Call(),))).outcomes[0]
        if kind_of(outcome) != "answer":
            return None
        answer = outcome.answer
        if isinstance(answer, HttpAnswer):
            return {"status": answer.status, "body": answer.body}
        return json.loads(_json(answer))

    async def _violations_async(self, scenario: Scenario) -> list[str]:
        return await asyncio.to_thread(self.violations, scenario)

    def shrink(self, failure: Failure, budget: int = 80) -> Failure:
        async def shrinking() -> tuple[Scenario, list[str]]:
            return await shrink_live(
                failure.scenario,
                self._violations_async,
                failure.violations,
                candidates,
                budget=budget,
            )

        scenario, violations = asyncio.run(shrinking())
        return Failure(scenario, violations, failure.tried)

    def simplest_payload(self, failure: Failure, payloads: list[Any]) -> Failure:
        """The shrunk scenario with the shortest of ``payloads`` that still fails it."""
        wanted = failure.violations[0].split(":", 1)[0]
        for payload in sorted(payloads, key=lambda p: len(repr(p))):
            if len(repr(payload)) >= len(repr(failure.scenario.payload)):
                break
            if any(call.variant for call in failure.scenario.calls):
                break  # the variant belongs to its payload
            candidate = replace(failure.scenario, payload=payload)
            got = self.violations(candidate)
            if any(v.split(":", 1)[0] == wanted for v in got):
                return Failure(candidate, got, failure.tried)
        return failure


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _captured() -> Iterator[list[logging.LogRecord]]:
    """The library's warnings and errors while scenarios run: kept for the oracle (a
    transactional route that never ran its transaction is reported there), not shown
    (the scenarios fail stores on purpose)."""
    logger = logging.getLogger("idempotency_async")
    handler = _Records()
    saved = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.propagate = saved


def _path(path: tuple[Any, ...]) -> str:
    return "".join(f"[{part!r}]" for part in path) or "the whole answer"


def _json(value: Any) -> str:
    def default(obj: Any) -> Any:
        if hasattr(obj, "model_dump"):
            return obj.model_dump(mode="json")
        return repr(obj)

    return json.dumps(value, default=default)


def _close(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        # A task that will not end goes with the loop.
        with contextlib.suppress(Deadlock, RuntimeError):
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.close()
