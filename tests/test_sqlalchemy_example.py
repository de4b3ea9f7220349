"""examples/fastapi_sqlalchemy.py as a real server (uvicorn) on the real postgres: its
order rows and idempotency records commit together."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from _postgres import PostgresServer, fresh_table_name
from test_examples_http import _exercise, running

pytestmark = pytest.mark.postgres

# The example imports this checkout's package, whatever is installed.
_PATH = {"PYTHONPATH": str(Path(__file__).parents[1])}


async def test_orders_and_records_commit_together(postgres_server: PostgresServer) -> None:
    records, orders = fresh_table_name(), fresh_table_name()
    env = {
        **_PATH,
        "DATABASE_URL": postgres_server.dsn,
        "IDEMPOTENCY_TABLE": records,
        "ORDERS_TABLE": orders,
    }
    async with running("fastapi_sqlalchemy.py", env) as url:
        await _exercise(url)  # alice's order, its replay, a reused key, bob's order
        headers = {"Idempotency-Key": "order-9", "X-API-Key": "carol"}
        order = {"sku": "C3", "qty": 1, "slow": 0.3}
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            concurrent = await asyncio.gather(
                *(client.post("/orders", json=order, headers=headers) for _ in range(5))
            )
            listed = (await client.get("/orders")).json()

    assert [response.status_code for response in concurrent] == [201] * 5
    replayed = [response.headers.get("idempotent-replayed") == "true" for response in concurrent]
    assert replayed.count(False) == 1
    assert len({response.content for response in concurrent}) == 1
    carol = concurrent[0].json()["id"]
    # alice's, bob's and carol's orders: one each, whatever the retries and duplicates
    assert len(listed) == 3 and carol in {row["id"] for row in listed}

    connection = await postgres_server.connect()
    try:
        statuses = await connection.fetch(f"SELECT status FROM {records}")
        rows = await connection.fetchval(f"SELECT count(*) FROM {orders}")
    finally:
        await connection.close()
    assert sorted(row["status"] for row in statuses) == ["COMPLETED"] * 3
    assert rows == 3
