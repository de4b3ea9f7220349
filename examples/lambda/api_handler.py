"""An idempotent API handler: ``POST /orders`` creates each order once, whatever the retries.

Deployed with ``template.yaml`` (handler ``api_handler.handler``).  The key is the
``order_id`` of the JSON body, not the whole event: API Gateway gives every retry a new
``requestContext.requestId``, so hashing the event would never recognise a retry.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from idempotency_async import Manager, Options, errors
from idempotency_async.integrations.aws_lambda import idempotent_handler, lambda_entrypoint
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
manager = Manager(
    store,
    Options(
        event_key_jmespath="powertools_json(body).order_id",
        # Reusing an order_id with another amount is a client bug: answer 422, not a replay.
        payload_validation_jmespath="powertools_json(body).[amount, currency]",
        raise_on_no_key=True,
    ),
)


@idempotent_handler(manager)
async def create_order(event: dict[str, Any], context: Any) -> dict[str, Any]:
    order = json.loads(event["body"])
    # A real handler charges the card and writes the order here: once per order_id.
    confirmation = uuid.uuid4().hex
    return _json(201, {"order_id": order["order_id"], "confirmation": confirmation})


async def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Map the library's errors to HTTP answers; everything else is a 5xx from Lambda."""
    try:
        return await create_order(event, context)
    except (errors.KeyMissingError, errors.PayloadError):
        return _json(400, {"title": "the body must be JSON with an order_id"})
    except errors.PayloadValidationError:
        return _json(422, {"title": "this order_id was used with a different order"})
    except errors.AlreadyInProgressError:
        return _json(409, {"title": "this order is being created; retry in a few seconds"})


def _json(status: int, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "statusCode": status,
        "headers": {"content-type": "application/json"},
        "body": json.dumps(body),
    }


# The synchronous function Lambda calls; one event loop serves every warm invocation.
handler = lambda_entrypoint(handle, shutdown=store.aclose)
