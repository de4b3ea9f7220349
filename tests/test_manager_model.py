"""A hypothesis state machine: the Manager against a model of the contract."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from support import Clock

from idempotency_async import Manager, MemoryStore, Options, errors

TTL = 100


class ManagerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = Clock()
        self.store = MemoryStore()
        self.manager = Manager(
            self.store,
            Options(
                key_prefix="m",
                expires_after=TTL,
                event_key_jmespath="id",
                payload_validation_jmespath="v",
                clock=self.clock,
                lease=10,
            ),
        )
        # Model: id -> (stored value, validation value, expires at)
        self.model: dict[int, tuple[Any, int, float]] = {}
        self.runs = 0
        self.expected_runs = 0

    def teardown(self) -> None:
        self.loop.close()

    def _call(self, key_id: int, v: int, result: Any, fail: bool) -> Any:
        async def work() -> Any:
            self.runs += 1
            if fail:
                raise ValueError("boom")
            return result

        return self.loop.run_until_complete(
            self.manager.execute({"id": key_id, "v": v}, work, timeout=5)
        )

    @rule(
        key_id=st.integers(0, 3),
        v=st.integers(0, 1),
        result=st.one_of(
            st.none(), st.integers(-3, 3), st.text(max_size=3), st.lists(st.booleans(), max_size=2)
        ),
        fail=st.booleans(),
    )
    def execute(self, key_id: int, v: int, result: Any, fail: bool) -> None:
        live = self.model.get(key_id)
        if live is not None and live[2] < self.clock.now:
            live = None
        if live is not None:
            stored, stored_v, _ = live
            if stored_v != v:
                try:
                    self._call(key_id, v, result, fail)
                except errors.PayloadValidationError:
                    return
                raise AssertionError("validation mismatch was not detected")
            assert self._call(key_id, v, result, fail) == stored
            return
        self.expected_runs += 1
        if fail:
            try:
                self._call(key_id, v, result, fail)
            except ValueError:
                self.model.pop(key_id, None)
                return
            raise AssertionError("callback error was swallowed")
        assert self._call(key_id, v, result, fail) == result
        self.model[key_id] = (result, v, self.clock.now + TTL)

    @rule(seconds=st.sampled_from([1, 50, 101]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @invariant()
    def callback_ran_exactly_when_the_model_says(self) -> None:
        assert self.runs == self.expected_runs


TestManagerModel = ManagerModel.TestCase
TestManagerModel.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
