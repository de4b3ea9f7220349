"""aiohttp with Idempotency-Key: ``POST /orders`` runs once per key and replays its response.

Run: ``python examples/aiohttp_app.py`` (http://127.0.0.1:8080), then::

    curl -i -X POST http://127.0.0.1:8080/orders -H 'Idempotency-Key: order-1' \
         -H 'X-API-Key: alice' -H 'Content-Type: application/json' -d '{"sku": "A1", "qty": 2}'

Records live in memory by default.  Set ``IDEMPOTENCY_DYNAMODB_TABLE`` (and, for a local
endpoint, ``AWS_ENDPOINT_URL``) to keep them in DynamoDB (needs the ``dynamodb`` extra).
"""

from __future__ import annotations

import asyncio
import itertools
import os

from aiohttp import web

from idempotency_async import Manager, MemoryStore, Options
from idempotency_async.integrations.aiohttp import (
    idempotency_middleware,
    idempotent_endpoint,
    request_state,
)
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


def caller(request: web.Request) -> str | None:
    # Stand-in for the authenticated principal set by an auth middleware placed before ours.
    return request.headers.get("X-API-Key")


_order_ids = itertools.count(1)


@idempotent_endpoint
async def create_order(request: web.Request) -> web.Response:
    body = await request.json()
    if not isinstance(body, dict) or not isinstance(body.get("sku"), str):
        # Raised, not returned: the key is released, so the client can fix the body.
        raise web.HTTPUnprocessableEntity(text="sku (string) is required")
    await asyncio.sleep(min(float(body.get("slow", 0)), 10))
    order_id = f"ord_{next(_order_ids):04d}"
    state = request_state(request)
    print(f"creating {order_id} for Idempotency-Key {state and state.key!r}")  # the side effect
    response = web.json_response({"id": order_id, "sku": body["sku"]}, status=201)
    response.headers["Location"] = f"/orders/{order_id}"
    return response


def make_app() -> web.Application:
    store = make_store()
    manager = Manager(store, Options(key_prefix="orders-api"))
    app = web.Application(
        middlewares=[idempotency_middleware(manager, paths=(), required=True, caller_scope=caller)]
    )
    app.router.add_post("/orders", create_order)

    async def close_store(app: web.Application) -> None:
        await store.aclose()

    app.on_cleanup.append(close_store)
    return app


if __name__ == "__main__":
    web.run_app(make_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "8080")))
