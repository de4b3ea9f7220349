"""A FastAPI service keeping its idempotency records in Redis (or Valkey).

Run one or more instances against the same Redis; a retried ``POST /orders`` gets the
first response replayed, whichever instance it reaches::

    REDIS_URL=redis://127.0.0.1:6379/0 PORT=8000 python examples/redis_app.py
    REDIS_URL=redis://127.0.0.1:6379/0 PORT=8001 python examples/redis_app.py
    curl -i -X POST http://127.0.0.1:8000/orders -H 'Idempotency-Key: order-1' \
         -H 'X-API-Key: alice' -H 'Content-Type: application/json' -d '{"sku": "A1", "qty": 2}'
    curl -i -X POST http://127.0.0.1:8001/orders -H 'Idempotency-Key: order-1' \
         -H 'X-API-Key: alice' -H 'Content-Type: application/json' -d '{"sku": "A1", "qty": 2}'

The second answer carries ``Idempotent-Replayed: true`` and the first one's body.  Use
``rediss://`` for TLS and ``redis://user:password@host`` for ACL users (docs/redis.md).
Needs the ``redis`` and ``fastapi`` extras.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, Field

from idempotency_async import Manager, Options
from idempotency_async.integrations.fastapi import IdempotencyKey
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.stores.redis import RedisStore

# The store owns the client it builds, and builds no connection before the first call.
store = RedisStore.from_url(
    os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    client_options={"max_connections": 50, "socket_timeout": 5.0},
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await store.load_scripts()  # a wrong URL, password or ACL fails here, not on a request
    yield
    await store.aclose()


def caller(request: Request) -> str | None:
    # Stand-in for the authenticated principal: one API key never replays another's responses.
    return request.headers.get("x-api-key")


app = FastAPI(lifespan=lifespan)
app.add_middleware(
    IdempotencyMiddleware,
    manager=Manager(store, Options(key_prefix="orders-api")),
    paths=(),  # only routes that declare the dependency below
    required=True,
    caller_scope=caller,
    request_timeout=30.0,
)


class Order(BaseModel):
    sku: str
    qty: int = Field(gt=0)
    slow: float = Field(0.0, ge=0, le=10, description="seconds to take (to see a 409)")


@app.post("/orders", status_code=201)
async def create_order(order: Order, key: IdempotencyKey, response: Response) -> dict[str, Any]:
    await asyncio.sleep(order.slow)
    # Unique across instances: the side effect a retry must not repeat.
    order_id = f"ord_{uuid.uuid4().hex[:12]}"
    print(f"creating {order_id} for Idempotency-Key {key!r}", flush=True)
    response.headers["Location"] = f"/orders/{order_id}"
    return {"id": order_id, "sku": order.sku, "qty": order.qty}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
