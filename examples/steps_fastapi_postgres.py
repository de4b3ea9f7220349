"""Recovery points over HTTP on PostgreSQL: an order, a charge and a receipt as three steps.

``POST /orders`` with an ``Idempotency-Key`` runs three steps, each recorded on the key's
record as it finishes:

1. ``create_order`` — a *transactional step*: the order row and the step's recovery point
   commit in one transaction (``connection=``), or neither does;
2. ``charge`` — a call to the payment provider (an HTTP service) carrying
   ``downstream_key("charge")`` as its ``Idempotency-Key``: a re-run of the step sends the
   same key, and the provider answers with the first charge;
3. ``send_receipt`` — a transactional step writing the receipt to an outbox table, which
   a relay (not shown) delivers.

A request that fails after the charge answers 500 and keeps its progress; the client's
retry with the same key and body resumes at the receipt.  A process that dies in the
middle leaves its progress on the record; the retry resumes once the short lease of the
dead process ends (``Renewal``; a waiting retry is answered then).  Run the provider and
the shop::

    PORT=8001 ROLE=provider python examples/steps_fastapi_postgres.py
    DATABASE_URL=postgres://app@127.0.0.1:5432/app PROVIDER_URL=http://127.0.0.1:8001 \\
        PORT=8000 python examples/steps_fastapi_postgres.py
    curl -i -X POST http://127.0.0.1:8000/orders -H 'Idempotency-Key: order-1' \\
         -H 'X-API-Key: alice' -H 'Content-Type: application/json' \\
         -d '{"sku": "A1", "qty": 2, "amount": 4200}'
    curl -s http://127.0.0.1:8001/charges

With ``DEMO_FAULTS=1`` the shop honours an ``X-Demo-Fault`` header (never enable it in
production): ``after-charge`` raises after the charge step (a 500), ``die-in-order`` ends
the process after the order's INSERT and before its step commits, ``die-in-charge`` after
the provider charged and before the step's recovery point is written.
The tables are created at start-up for the demo; in production create them with a
migration (``idempotency-async create-table --print-sql``, docs/postgres.md).  Needs the
``postgres`` and ``fastapi`` extras and httpx.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import httpx
import uvicorn
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, Field

from idempotency_async import Manager, Options, Renewal, Wait, downstream_key, step
from idempotency_async.integrations.fastapi import IdempotencyKey
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.stores.postgres import PostgresStore, create_table

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
TABLE = os.environ.get("IDEMPOTENCY_TABLE", "idempotency_records")
ORDERS_TABLE = os.environ.get("ORDERS_TABLE", "shop_orders")
OUTBOX_TABLE = os.environ.get("OUTBOX_TABLE", "shop_outbox")
PROVIDER_URL = os.environ.get("PROVIDER_URL", "http://127.0.0.1:8001")
# How long a dead process blocks its key: one short lease, renewed while a request runs.
LEASE_SECONDS = float(os.environ.get("LEASE_SECONDS", "10"))
DEMO_FAULTS = os.environ.get("DEMO_FAULTS") == "1"


# -- the payment provider: a separate service that deduplicates by Idempotency-Key --------

provider = FastAPI()
provider_requests: Counter[str] = Counter()
provider_charges: dict[str, dict[str, Any]] = {}
_charge_ids = itertools.count(1)


@provider.post("/charges")
async def provider_charge(request: Request) -> dict[str, Any]:
    key = request.headers["idempotency-key"]
    provider_requests[key] += 1
    if key not in provider_charges:  # a repeated key gets the first charge back
        amount = (await request.json())["amount"]
        provider_charges[key] = {"id": f"ch_{next(_charge_ids)}", "amount": amount}
        print(f"provider: charged {amount} for key {key!r}", flush=True)
    return provider_charges[key]


@provider.get("/charges")
async def provider_list() -> dict[str, Any]:
    return {"charges": provider_charges, "requests": provider_requests}


# -- the shop ----------------------------------------------------------------------------

store = PostgresStore.from_url(DATABASE_URL, table=TABLE)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await create_table(DATABASE_URL, table=TABLE)  # a wrong URL or password fails here
    pool = await asyncpg.create_pool(DATABASE_URL, min_size=1, max_size=10)
    try:
        async with pool.acquire() as connection:
            await connection.execute(
                f"CREATE TABLE IF NOT EXISTS {ORDERS_TABLE} (id text PRIMARY KEY, sku text "
                "NOT NULL, qty integer NOT NULL, amount integer NOT NULL, charge text)"
            )
            await connection.execute(
                f"CREATE TABLE IF NOT EXISTS {OUTBOX_TABLE} (id bigserial PRIMARY KEY, "
                "order_id text NOT NULL, kind text NOT NULL, charge text NOT NULL)"
            )
        async with store, httpx.AsyncClient(base_url=PROVIDER_URL, timeout=10) as payments:
            app.state.pool, app.state.payments = pool, payments
            yield
    finally:
        await pool.close()


def caller(request: Request) -> str | None:
    # Stand-in for the authenticated principal: one API key never replays another's responses.
    return request.headers.get("x-api-key")


app = FastAPI(lifespan=lifespan)
app.add_middleware(
    IdempotencyMiddleware,
    manager=Manager(store, Options(key_prefix="shop", renewal=Renewal(lease=LEASE_SECONDS))),
    paths=(),  # only routes that declare an IdempotencyKey parameter
    caller_scope=caller,
    request_timeout=30.0,
    wait=Wait(timeout=20.0),  # a duplicate waits for the request holding its key
)


class Cart(BaseModel):
    sku: str
    qty: int = Field(gt=0)
    amount: int = Field(gt=0, description="in cents")
    slow: float = Field(0.0, ge=0, le=10, description="seconds the charge takes (demo)")


async def insert_order(connection: Any, cart: Cart, fault: str | None) -> dict[str, Any]:
    # Runs in the step's transaction: the row commits with the recovery point, or not at all.
    order_id = f"ord_{uuid.uuid4().hex[:12]}"
    await connection.execute(
        f"INSERT INTO {ORDERS_TABLE} (id, sku, qty, amount) VALUES ($1, $2, $3, $4)",
        order_id,
        cart.sku,
        cart.qty,
        cart.amount,
    )
    if fault == "die-in-order":  # inserted, not committed: the row goes with the process
        print("the shop process dies in the create_order step", flush=True)
        os._exit(1)
    return {"id": order_id, "amount": cart.amount}


async def charge_card(
    payments: httpx.AsyncClient, order: dict[str, Any], slow: float, fault: str | None
) -> dict[str, Any]:
    await asyncio.sleep(slow)
    # Derived inside the step: the same key on every run of this step of this request.
    headers = {"Idempotency-Key": downstream_key("charge")}
    answer = await payments.post("/charges", json={"amount": order["amount"]}, headers=headers)
    answer.raise_for_status()
    if fault == "die-in-charge":  # the provider charged; the recovery point is not written
        print("the shop process dies in the charge step", flush=True)
        os._exit(1)
    charge: dict[str, Any] = answer.json()
    return charge


async def queue_receipt(connection: Any, order: dict[str, Any], charge: dict[str, Any]) -> int:
    # The order's charge and its receipt, in the step's transaction.
    await connection.execute(
        f"UPDATE {ORDERS_TABLE} SET charge = $2 WHERE id = $1", order["id"], charge["id"]
    )
    receipt: int = await connection.fetchval(
        f"INSERT INTO {OUTBOX_TABLE} (order_id, kind, charge) VALUES ($1, 'receipt', $2) "
        "RETURNING id",
        order["id"],
        charge["id"],
    )
    return receipt


@app.post("/orders", status_code=201)
async def place_order(
    cart: Cart, key: IdempotencyKey, request: Request, response: Response
) -> dict[str, Any]:
    pool, payments = request.app.state.pool, request.app.state.payments
    fault = request.headers.get("x-demo-fault") if DEMO_FAULTS else None
    # The same steps in the same order on every run; a retry replays the recorded ones.
    async with pool.acquire() as connection:  # not in a transaction: the step opens its own
        order = await step(
            "create_order", lambda: insert_order(connection, cart, fault), connection=connection
        )
    charge = await step("charge", lambda: charge_card(payments, order, cart.slow, fault))
    if fault == "after-charge":
        raise RuntimeError("the request failed after the charge")  # a 500, progress kept
    async with pool.acquire() as connection:
        receipt = await step(
            "send_receipt",
            lambda: queue_receipt(connection, order, charge),
            connection=connection,
        )
    print(f"order {order['id']} for Idempotency-Key {key!r}: {charge['id']}", flush=True)
    response.headers["Location"] = f"/orders/{order['id']}"
    return {"order": order["id"], "charge": charge["id"], "receipt": receipt}


if __name__ == "__main__":
    served = provider if os.environ.get("ROLE") == "provider" else app
    uvicorn.run(served, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
