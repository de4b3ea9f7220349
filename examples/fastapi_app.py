"""FastAPI with Idempotency-Key: ``POST /orders`` runs once per key and replays its response.

Run: ``python examples/fastapi_app.py`` (uvicorn on http://127.0.0.1:8000), then::

    curl -i -X POST http://127.0.0.1:8000/orders -H 'Idempotency-Key: order-1' \
         -H 'X-API-Key: alice' -H 'Content-Type: application/json' -d '{"sku": "A1", "qty": 2}'

Records live in memory by default.  Set ``IDEMPOTENCY_DYNAMODB_TABLE`` (and, for a local
endpoint such as moto or DynamoDB Local, ``AWS_ENDPOINT_URL``) to keep them in DynamoDB
(needs the ``dynamodb`` extra).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, Field

from idempotency_async import Manager, MemoryStore, Options
from idempotency_async.integrations.fastapi import IdempotencyKey, idempotency_openapi
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.stores.base import Store


def make_store() -> Store:
    table = os.environ.get("IDEMPOTENCY_DYNAMODB_TABLE")
    if not table:
        return MemoryStore()
    import aioboto3

    from idempotency_async.stores.dynamodb import DynamoDBStore

    session = aioboto3.Session()
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    return DynamoDBStore(
        table_name=table,
        client_factory=lambda: session.client("dynamodb", endpoint_url=endpoint),
    )


def caller(request: Request) -> str | None:
    # Stand-in for the authenticated principal (e.g. request.user.identity): one API key
    # can never replay another one's responses.
    return request.headers.get("x-api-key")


store = make_store()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    await store.aclose()


app = FastAPI(lifespan=lifespan)
app.add_middleware(
    IdempotencyMiddleware,
    manager=Manager(store, Options(key_prefix="orders-api")),
    paths=(),  # only routes that declare the dependency below
    required=True,
    caller_scope=caller,
    request_timeout=30.0,
)

_order_ids = itertools.count(1)


class Order(BaseModel):
    sku: str
    qty: int = Field(gt=0)
    slow: float = Field(0.0, ge=0, le=10, description="seconds to take (to see a 409)")


# openapi_extra documents the middleware's 400/409/422 answers in /docs.
@app.post("/orders", status_code=201, openapi_extra=idempotency_openapi())
async def create_order(order: Order, key: IdempotencyKey, response: Response) -> dict[str, Any]:
    await asyncio.sleep(order.slow)
    order_id = f"ord_{next(_order_ids):04d}"
    print(f"creating {order_id} for Idempotency-Key {key!r}")  # the side effect
    response.headers["Location"] = f"/orders/{order_id}"
    return {"id": order_id, "sku": order.sku, "qty": order.qty}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
