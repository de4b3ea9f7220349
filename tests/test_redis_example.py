"""examples/redis_app.py as two real servers sharing one real Redis."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx
import pytest
from _redis import RedisServer
from test_examples_http import _exercise, running

pytestmark = pytest.mark.redis

# The example imports this checkout's package, whatever is installed.
_PATH = {"PYTHONPATH": str(Path(__file__).parents[1])}


async def test_two_instances_share_records_through_redis(redis_server: RedisServer) -> None:
    env = {**_PATH, "REDIS_URL": f"{redis_server.url}/3"}
    async with running("redis_app.py", env) as first, running("redis_app.py", env) as second:
        await _exercise(first)
        headers = {"Idempotency-Key": "order-9", "X-API-Key": "carol"}
        order = {"sku": "C3", "qty": 1}
        async with httpx.AsyncClient() as client:
            created = await client.post(f"{first}/orders", json=order, headers=headers)
            replayed = await client.post(f"{second}/orders", json=order, headers=headers)
        assert created.status_code == replayed.status_code == 201
        assert replayed.headers["idempotent-replayed"] == "true"
        assert replayed.json() == created.json()

    async with redis_server.client(db=3) as client:
        keys = await client.keys("orders-api#*")
        records = [json.loads(await client.get(key)) for key in keys]
    # alice's, bob's and carol's records, with a TTL each
    assert sorted(record["status"] for record in records) == ["COMPLETED"] * 3
    async with redis_server.client(db=3) as client:
        ttls = [await client.ttl(key) for key in keys]
    # The record expires at ceil(now + ttl) and its key one second later; TTL rounds to
    # the nearest second, so a fresh key reads 3601 or 3602.
    assert all(3000 < ttl <= 3602 for ttl in ttls), ttls


async def test_a_wrong_password_fails_at_startup(redis_server: RedisServer) -> None:
    env = {**_PATH, "REDIS_URL": f"redis://nobody:wrong@127.0.0.1:{redis_server.port}/0"}
    completed = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).parents[1] / "examples" / "redis_app.py"),
        env={**os.environ, **env, "PORT": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(completed.communicate(), timeout=60)
    assert completed.returncode != 0
    assert b"StoreAccessDeniedError" in output
