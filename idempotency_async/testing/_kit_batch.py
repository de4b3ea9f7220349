"""The test kit's SQS batch door: a Lambda handler of SQS batches (``process_batch``).

Each payload is one message's body, delivered in a batch of its own (``copies`` times in
it, when asked: a standard queue delivers at least once); every call of a scenario
redelivers the same message (the same ``messageId``, as SQS does), so the kit's
duplicates are redeliveries.  A call is answered when the handler's partial batch
response names no failure; a message it names is :class:`BatchItemFailed` (SQS will
redeliver it).  The tasks ``process_batch`` runs each record in are counted in the call's
awaits: a crash point cancels the record's task there, not only the invocation.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from idempotency_async.stores.base import Store
from idempotency_async.testing._kit_targets import LambdaContext, Sender, callable_name

__all__ = ["BatchItemFailed", "SqsBatchHandler", "sqs_event"]

_QUEUE = "arn:aws:sqs:us-east-1:123456789012:idempotency-kit"


class BatchItemFailed(Exception):
    """The handler's partial batch response named the message: SQS redelivers it."""


def sqs_event(payload: Any, message_id: str, copies: int = 1) -> dict[str, Any]:
    """An SQS event holding ``copies`` deliveries of one message whose body is ``payload``
    (JSON unless a string): a standard queue delivers at least once, a batch included."""
    body = payload if isinstance(payload, str) else json.dumps(payload)
    record = {
        "messageId": message_id,
        "receiptHandle": f"receipt-{message_id}",
        "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "0"},
        "messageAttributes": {},
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": _QUEUE,
        "awsRegion": "us-east-1",
    }
    return {"Records": [dict(record) for _ in range(copies)]}


@dataclass(frozen=True, slots=True)
class SqsBatchHandler:
    """An ``async def handler(event, context)`` of SQS batches built on a store by
    ``build``; each payload is a message body, invoked with ``timeout`` seconds."""

    build_handler: Callable[[Store], Callable[[Any, Any], Awaitable[Any]]]
    timeout: float = 30.0
    copies: int = 1
    """Deliveries of the message in each batch."""
    child_tasks: ClassVar[bool] = True
    """The record tasks ``process_batch`` creates are crash points too."""

    def build(self, store: Store) -> Sender:
        handler = self.build_handler(store)

        async def send(payload: Any, request_key: str) -> Any:
            message_id = f"{request_key}-message"
            event = sqs_event(payload, message_id, self.copies)
            response = await handler(event, LambdaContext(self.timeout))
            failures = response.get("batchItemFailures") if isinstance(response, dict) else None
            if failures is None:
                raise TypeError(
                    f"an SQS batch handler returns a partial batch response "
                    f'({{"batchItemFailures": [...]}}), not {response!r}'
                )
            if failures:
                raise BatchItemFailed(f"message {message_id} reported in batchItemFailures")
            return response

        return send

    def key_of(self, sender: Sender, payload: Any, request_key: str) -> str | None:
        return None

    def expression(self) -> str:
        extra = f", timeout={self.timeout!r}" if self.timeout != 30.0 else ""
        if self.copies != 1:
            extra += f", copies={self.copies!r}"
        return f"sqs_batch_handler({callable_name(self.build_handler)}{extra})"
