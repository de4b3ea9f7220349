"""A FastAPI order service whose order rows and idempotency records commit together.

The endpoint writes its order with a SQLAlchemy 2 ``AsyncSession`` (asyncpg driver) and
records its response in the same transaction: either both commit or neither does, so a
retry after any failure — a crash, a rollback, a lost connection — runs again, and a retry
after the COMMIT replays::

    DATABASE_URL=postgres://app@127.0.0.1:5432/app PORT=8000 python examples/fastapi_sqlalchemy.py
    curl -i -X POST http://127.0.0.1:8000/orders -H 'Idempotency-Key: order-1' \\
         -H 'X-API-Key: alice' -H 'Content-Type: application/json' -d '{"sku": "A1", "qty": 2}'
    curl -i -X POST http://127.0.0.1:8000/orders -H 'Idempotency-Key: order-1' \\
         -H 'X-API-Key: alice' -H 'Content-Type: application/json' -d '{"sku": "A1", "qty": 2}'
    curl -s http://127.0.0.1:8000/orders

The second answer carries ``Idempotent-Replayed: true`` and the first one's body, and
``GET /orders`` lists one order.  Duplicates sent while the first request's transaction is
open wait for its COMMIT and replay it (``wait=Wait(timeout=10.0)``).  The tables are created
at start-up here for the demo; in production create them with a migration (``idempotency-async
create-table --print-sql``, docs/postgres.md).  Needs the ``postgres`` and ``fastapi``
extras and the ``sqlalchemy`` extra (``pip install -e '.[postgres,sqlalchemy,fastapi]'``).
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
from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from idempotency_async import Manager, Options, Wait
from idempotency_async.integrations.fastapi import IdempotentTransaction
from idempotency_async.integrations.starlette import IdempotencyMiddleware
from idempotency_async.stores.postgres import PostgresStore, create_table

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
TABLE = os.environ.get("IDEMPOTENCY_TABLE", "idempotency_records")
ORDERS_TABLE = os.environ.get("ORDERS_TABLE", "orders")

# The application's engine (SQLAlchemy, asyncpg driver) writes the orders and, in the same
# transactions, the idempotency records; the store's own pool only reads committed records
# (a duplicate's first look) and serves the operator commands.
engine = create_async_engine(
    DATABASE_URL.replace("postgres://", "postgresql+asyncpg://", 1), pool_size=20
)
Session = async_sessionmaker(engine, expire_on_commit=False)
store = PostgresStore.from_url(DATABASE_URL, table=TABLE)


class Base(DeclarativeBase):
    pass


class OrderRow(Base):
    __tablename__ = ORDERS_TABLE

    id: Mapped[str] = mapped_column(primary_key=True)
    sku: Mapped[str]
    qty: Mapped[int]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # A wrong URL or password fails here, not on a request.
    await create_table(DATABASE_URL, table=TABLE)
    async with engine.begin() as connection:
        await connection.run_sync(Base.metadata.create_all)
    async with store:
        yield
    await engine.dispose()


def caller(request: Request) -> str | None:
    # Stand-in for the authenticated principal: one API key never replays another's responses.
    return request.headers.get("x-api-key")


app = FastAPI(lifespan=lifespan)
app.add_middleware(
    IdempotencyMiddleware,
    manager=Manager(store, Options(key_prefix="orders-api")),
    paths=(),  # only routes that declare an idempotency dependency
    caller_scope=caller,
    wait=Wait(timeout=10.0),  # a duplicate waits for the first request's COMMIT, then replays it
)


class Order(BaseModel):
    sku: str
    qty: int = Field(gt=0)
    slow: float = Field(0.0, ge=0, le=10, description="seconds to take inside the transaction")


class Created(BaseModel):
    id: str
    sku: str
    qty: int


@app.post("/orders", status_code=201, response_model=Created)
async def create_order(order: Order, tx: IdempotentTransaction, response: Response) -> Response:
    async with Session() as session, session.begin():

        async def work() -> Created:
            # Runs once per Idempotency-Key (again only if an earlier run rolled back).
            order_id = f"ord_{uuid.uuid4().hex[:12]}"
            session.add(OrderRow(id=order_id, sku=order.sku, qty=order.qty))
            await session.flush()
            await asyncio.sleep(order.slow)
            print(f"creating {order_id} for Idempotency-Key {tx.key!r}", flush=True)
            response.headers["Location"] = f"/orders/{order_id}"
            return Created(id=order_id, sku=order.sku, qty=order.qty)

        # The order row and the record (with this response, serialized as the route
        # serializes a return value) are written in this transaction; a duplicate that
        # committed first is replayed instead.
        answer = await tx.run(session, work)
    # Leaving session.begin() committed both: the point of no return.  Had the COMMIT (or
    # a statement after run()) failed, neither would exist and a retry would run the work.
    replayed = answer.headers.get("idempotent-replayed") == "true"
    print(f"answered Idempotency-Key {tx.key!r} (replayed: {replayed})", flush=True)
    return answer


@app.get("/orders")
async def list_orders() -> list[dict[str, Any]]:
    async with Session() as session:
        rows = (await session.scalars(select(OrderRow).order_by(OrderRow.id))).all()
    return [{"id": row.id, "sku": row.sku, "qty": row.qty} for row in rows]


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
