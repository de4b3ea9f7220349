"""An SQS batch handler: each message ships its order once; failed messages are redelivered.

Deployed with ``template.yaml`` (handler ``sqs_handler.handler``, with
``FunctionResponseTypes: [ReportBatchItemFailures]`` on the event source mapping).
"""

from __future__ import annotations

import os
from typing import Any

from idempotency_async import Manager, Options
from idempotency_async.integrations.aws_lambda import lambda_entrypoint, process_batch
from idempotency_async.stores.dynamodb import DynamoDBStore
from idempotency_async.stores.dynamodb_light import LightDynamoDBClient

# The light DynamoDB client (extra dynamodb-light): it imports no botocore, so the cold
# start is about a quarter of aioboto3's (docs/lambda.md, "Cold start").  It signs with
# the credentials in the environment: Lambda sets them for the function's role.  On a
# laptop with a profile or SSO, export them into the shell first (AWS CLI v2), and this
# same line works there:
#   eval "$(aws configure export-credentials --profile dev --format env)"; export AWS_REGION=...
# The store opens the client on the first invocation, inside the event loop that
# lambda_entrypoint keeps for warm invocations.
store = DynamoDBStore(
    table_name=os.environ["IDEMPOTENCY_TABLE"], client_factory=LightDynamoDBClient
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
