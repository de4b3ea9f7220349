"""The exchange's answers for each outcome of the manager, against a fake manager.

The real-server suites cover the common paths; these pin the branches that need a store
misbehaving at the right moment (409, 503, 504, a failed completion).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest

from idempotency_async import Manager, MemoryStore, errors
from idempotency_async.integrations._http import (
    HttpIdempotency,
    HttpSettings,
    RequestState,
    ResponseGate,
)
from idempotency_async.integrations._http._exchange import run


class FakeManager:
    """Raises ``error`` from ``execute_call``, after running the callback when ``runs``."""

    def __init__(self, error: BaseException | None, *, runs: bool = False) -> None:
        self.error = error
        self.runs = runs
        self.store = MemoryStore()
        self.options = Manager(self.store).options
        self.observer = None  # no telemetry

    async def execute_call(
        self, payload: Any, callback: Callable[[Any], Awaitable[Any]], **_: Any
    ) -> Any:
        if self.runs:
            await callback(FakeCall())
        if self.error is not None:
            raise self.error
        return None


class FakeCall:
    async def complete(self, result: Any) -> None: ...

    async def complete_without_response(self, reason: str) -> None: ...

    def release(self, reason: str) -> None: ...


def _rules(manager: FakeManager) -> HttpIdempotency:
    rules = HttpIdempotency(
        Manager(MemoryStore()),
        HttpSettings(
            methods=("POST",),
            paths=None,
            required=False,
            caller_scope=lambda request: "c",
            request_timeout=7.0,
            max_body_bytes=1000,
            max_body_depth=10,
            max_response_bytes=1000,
            store_server_errors=False,
            replay_headers=(),
            wait=None,
        ),
    )
    rules.manager = manager  # type: ignore[assignment]
    return rules


async def _answer(
    error: BaseException | None, *, runs: bool = False, status: int | None = None
) -> tuple[Any, ResponseGate]:
    manager = FakeManager(error, runs=runs)
    rules = _rules(manager)
    gate = ResponseGate(rules, RequestState("k"), marked=False)

    async def endpoint() -> None:
        if status is not None:
            await gate.start(status, [("content-type", "text/plain")], b"body")

    deadline = asyncio.get_running_loop().time() + 7.0
    return await run(rules, {"scope": {}}, endpoint, gate, deadline), gate


@pytest.mark.parametrize(
    ("lease_left", "expected"),
    [
        (6.9, "1"),  # the holder just started: at least 1 s
        (4.2, "3"),  # it ran 2.8 s of its 7 s lease: as long again
        (1.5, "2"),  # it ran 5.5 s: never past its lease end
        (None, "1"),  # the store did not say
    ],
)
async def test_in_progress_is_409_with_a_retry_after_that_follows_the_work(
    lease_left: float | None, expected: str
) -> None:
    error = errors.AlreadyInProgressError("busy", key="k", lease_end=None, retry_after=lease_left)
    answer, _ = await _answer(error)
    assert answer.status == 409
    assert dict(answer.headers)["retry-after"] == expected


async def test_inconsistent_record_is_a_503_retried_after_a_minute() -> None:
    answer, _ = await _answer(errors.InconsistentStateError("record r: bogus 'X' unknown"))
    assert answer.status == 503
    assert int(dict(answer.headers)["retry-after"]) >= 60
    assert b"bogus" not in answer.body  # the store's details are for the operator's log


async def test_store_failure_before_the_endpoint_ran_is_a_generic_503() -> None:
    answer, _ = await _answer(errors.StoreUnavailableError("table t at http://internal"))
    assert answer.status == 503
    assert b"internal" not in answer.body and dict(answer.headers)["retry-after"] == "1"


async def test_store_failure_after_the_endpoint_ran_propagates() -> None:
    with pytest.raises(errors.StoreUnavailableError):
        await _answer(errors.StoreUnavailableError("down"), runs=True, status=201)


async def test_cut_off_before_any_head_is_504() -> None:
    answer, gate = await _answer(errors.DeadlineExceededError("cut off", key="k"))
    assert answer.status == 504 and not gate.forwarded
    assert dict(answer.headers)["retry-after"] == "7"


async def test_cut_off_after_a_head_went_out_sends_nothing_more() -> None:
    answer, gate = await _answer(
        errors.DeadlineExceededError("cut off", key="k"), runs=True, status=503
    )
    assert answer is None and gate.forwarded


async def test_completion_error_after_the_endpoint_ran_leaves_the_live_response() -> None:
    error = errors.CompletionError("write failed", key="k", result=None, outcome_unknown=True)
    answer, _ = await _answer(error, runs=True, status=201)
    assert answer is None


async def test_completion_error_without_a_run_propagates() -> None:
    error = errors.CompletionError("write failed", key="k", result=None, outcome_unknown=False)
    with pytest.raises(errors.CompletionError):
        await _answer(error)


async def test_reused_key_is_422_and_not_stored_names_the_reason() -> None:
    reused, _ = await _answer(errors.PayloadValidationError("differs", key="k"))
    not_stored, _ = await _answer(
        errors.ResponseNotStoredError("gone", key="k", reason="HTTP 201: too large: 9 bytes")
    )
    assert reused.status == 422
    assert not_stored.status == 201
    assert "too large: 9 bytes" in orjson.loads(not_stored.body)["detail"]
