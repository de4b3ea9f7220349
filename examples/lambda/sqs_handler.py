"""An SQS batch handler: each message ships its order once; failed messages are redelivered.

Deployed with ``template.yaml`` (handler ``sqs_handler.handler``, with
``FunctionResponseTypes: [ReportBatchItemFailures]`` on the event source mapping).
"""

from __future__ import annotations

import os
from typing import Any

import aioboto3

from idempotency_async import Manager, Options
from idempotency_async.integrations.aws_lambda import lambda_entrypoint, process_batch
from idempotency_async.stores.dynamodb import DynamoDBStore

session = aioboto3.Session()
store = DynamoDBStore(
    table_name=os.environ["IDEMPOTENCY_TABLE"],
    client_factory=lambda: session.client("dynamodb"),
)
# Bodies arrive parsed, so the key selects from them directly.  Without an
# event_key_jmespath, process_batch keys each message by its messageId.
manager = Manager(store, Options(key_prefix="ship-order", event_key_jmespath="body.order_id"))

shipped: list[str] = []
"""Stands in for the warehouse API this handler calls."""


async def ship(record: dict[str, Any]) -> dict[str, Any]:
    order = record["body"]
    if order["quantity"] <= 0:
        raise ValueError(f"order {order['order_id']} has no items to ship")
    shipped.append(order["order_id"])
    return {"order_id": order["order_id"], "status": "shipped"}


async def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return await process_batch(manager, event, ship, context=context)


handler = lambda_entrypoint(handle, shutdown=store.aclose)
