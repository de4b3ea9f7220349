"""examples/fastapi_postgres.py as two real servers sharing one real postgres."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import pytest
from _postgres import PostgresServer, fresh_table_name
from test_examples_http import _exercise, running

pytestmark = pytest.mark.postgres

# The example imports this checkout's package, whatever is installed.
_PATH = {"PYTHONPATH": str(Path(__file__).parents[1])}


async def test_two_instances_share_records_through_postgres(
    postgres_server: PostgresServer,
) -> None:
    table = fresh_table_name()
    env = {**_PATH, "DATABASE_URL": postgres_server.dsn, "IDEMPOTENCY_TABLE": table}
    async with (
        running("fastapi_postgres.py", env) as first,
        running("fastapi_postgres.py", env) as second,
    ):
        await _exercise(first)
        headers = {"Idempotency-Key": "order-9", "X-API-Key": "carol"}
        order = {"sku": "C3", "qty": 1}
        async with httpx.AsyncClient() as client:
            created = await client.post(f"{first}/orders", json=order, headers=headers)
            replayed = await client.post(f"{second}/orders", json=order, headers=headers)
        assert created.status_code == replayed.status_code == 201
        assert replayed.headers["idempotent-replayed"] == "true"
        assert replayed.json() == created.json()

    connection = await postgres_server.connect()
    try:
        rows = await connection.fetch(
            f"SELECT status, expires_at - clock_timestamp() AS left FROM {table}"
        )
    finally:
        await connection.close()
    # alice's, bob's and carol's records, each living an hour by the server's clock
    assert sorted(row["status"] for row in rows) == ["COMPLETED"] * 3
    assert all(3000 < row["left"].total_seconds() <= 3601 for row in rows)


async def test_a_wrong_password_fails_at_startup(postgres_server: PostgresServer) -> None:
    env = {
        **_PATH,
        "DATABASE_URL": f"postgres://nobody@127.0.0.1:{postgres_server.port}/postgres",
    }
    completed = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).parents[1] / "examples" / "fastapi_postgres.py"),
        env={**os.environ, **env, "PORT": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(completed.communicate(), timeout=60)
    assert completed.returncode != 0
    assert b"StoreAccessDeniedError" in output
