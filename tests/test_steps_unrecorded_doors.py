"""A step whose recovery point was not recorded, raised out of a door's endpoint or record
handler: the door must treat it as the handler's own failure (the work did not finish),
not as a completion that failed after the work was done.  Both were found by the fault
simulator's steps axis (HTTP gate x steps, batch x steps)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotency_async import Manager, MemoryStore, Options, step
from idempotency_async.errors import StepNotRecordedError, StoreUnavailableError
from idempotency_async.integrations.aws_lambda import process_batch
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.stores.base import Stepped, StepWrite


class _StepWritesFail(MemoryStore):
    """A MemoryStore whose recovery-point writes fail (a store outage mid-call)."""

    async def record_step(self, write: StepWrite) -> Stepped:
        raise StoreUnavailableError("the store is down (test)")


def _record(message_id: str, order: str) -> dict[str, Any]:
    return {
        "messageId": message_id,
        "receiptHandle": f"handle-{message_id}",
        "eventSource": "aws:sqs",
        "body": f'{{"order_id": "{order}"}}',
    }


async def test_a_batch_record_whose_step_was_not_recorded_is_redelivered() -> None:
    manager = Manager(_StepWritesFail(), Options(event_key_jmespath="body.order_id"))
    shipped: list[str] = []
    finished: list[str] = []

    async def handle(record: dict[str, Any]) -> str:
        order = record["body"]["order_id"]

        async def ship() -> str:
            shipped.append(order)
            return order

        await step("ship", ship)
        finished.append(order)  # never reached: the step's write failed
        return order

    answer = await process_batch(manager, {"Records": [_record("m-1", "o-1")]}, handle)

    assert shipped == ["o-1"] and finished == []
    # The handler did not finish: the message must come back (its retry resumes the key
    # once its lease ends), not be deleted from the queue as processed.
    assert answer == {"batchItemFailures": [{"itemIdentifier": "m-1"}]}


async def test_a_batch_record_whose_completion_failed_is_still_processed() -> None:
    # The other side of the line: a handler that finished, its result not recorded, is
    # not redelivered (that could only run its side effect twice).
    class _CompletionsFail(MemoryStore):
        async def complete(self, completion: Any) -> Any:
            raise StoreUnavailableError("the store is down (test)")

    manager = Manager(_CompletionsFail(), Options(event_key_jmespath="body.order_id"))

    async def handle(record: dict[str, Any]) -> str:
        return str(record["body"]["order_id"])

    answer = await process_batch(manager, {"Records": [_record("m-1", "o-1")]}, handle)
    assert answer == {"batchItemFailures": []}


async def test_an_endpoint_whose_step_was_not_recorded_raises_it() -> None:
    charged: list[int] = []

    async def charge(request: Request) -> JSONResponse:
        async def effect() -> int:
            charged.append(1)
            return 1

        await step("charge", effect)
        return JSONResponse({"charged": True})

    app = Starlette(routes=[Route("/charge", charge, methods=["POST"])])
    app.add_middleware(
        IdempotencyMiddleware,
        manager=Manager(_StepWritesFail()),
        paths=("/charge",),
        required=True,
        request_timeout=2.0,
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        # The endpoint's own exception propagates (the server answers 500), as its other
        # exceptions do: it is not a completion that failed after the response went out
        # (the gate then sent nothing at all, and the client got no response).
        with pytest.raises(StepNotRecordedError):
            await client.post("/charge", json={"amount": 1}, headers={"Idempotency-Key": "k1"})
    assert charged == [1]
