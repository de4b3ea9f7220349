"""A FastAPI service keeping its idempotency records in PostgreSQL.

Run one or more instances against the same database; a retried ``POST /orders`` gets the
first response replayed, whichever instance it reaches::

    DATABASE_URL=postgres://app@127.0.0.1:5432/app PORT=8000 python examples/fastapi_postgres.py
    DATABASE_URL=postgres://app@127.0.0.1:5432/app PORT=8001 python examples/fastapi_postgres.py
    curl -i -X POST http://127.0.0.1:8000/orders -H 'Idempotency-Key: order-1' \
         -H 'X-API-Key: alice' -H 'Content-Type: application/json' -d '{"sku": "A1", "qty": 2}'
    curl -i -X POST http://127.0.0.1:8001/orders -H 'Idempotency-Key: order-1' \
         -H 'X-API-Key: alice' -H 'Content-Type: application/json' -d '{"sku": "A1", "qty": 2}'

The second answer carries ``Idempotent-Replayed: true`` and the first one's body.  The
table is created at start-up here for the demo; in production create it with a migration
(``idempotency-async create-table --print-sql``, docs/postgres.md).  Behind PgBouncer
older than 1.21, add ``pool_options={"statement_cache_size": 0}``.  Needs the
``postgres`` and ``fastapi`` extras.
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
from idempotency_async.stores.postgres import PostgresStore, create_table

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
TABLE = os.environ.get("IDEMPOTENCY_TABLE", "idempotency_records")

# The store owns the pool it builds, and opens no connection before the first call.
store = PostgresStore.from_url(
    DATABASE_URL, table=TABLE, pool_options={"min_size": 1, "max_size": 20}
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # A wrong URL or password fails here, not on a request.
    await create_table(DATABASE_URL, table=TABLE)
    async with store:
        yield


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
