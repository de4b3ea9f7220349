"""The ``idempotency-async`` command on ``redis://`` stores, against a real redis-server."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from _cli import cli

from idempotency_async import Manager, Options

redis_store = pytest.importorskip(
    "idempotency_async.stores.redis",
    reason="the Redis store is not part of this build (test_cli.py checks the error instead)",
)

# Only once the store is known to exist: the harness imports redis-py.
from _redis import redis_server  # noqa: E402, F401  (fixture)


async def test_get_and_release_on_redis(redis_server: Any) -> None:  # noqa: F811
    prefix = f"cli{uuid.uuid4().hex[:8]}:"
    store = redis_store.RedisStore.from_url(redis_server.url, key_prefix=prefix)
    try:
        manager = Manager(store, Options(key_prefix="shop", event_key_jmespath="order_id"))
        await manager.execute({"order_id": 9}, lambda: asyncio.sleep(0, {"ok": 1}), timeout=30)
        key = manager.key_for({"order_id": 9})
    finally:
        await store.aclose()
    url = f"{redis_server.url}/0?key_prefix={prefix}"
    derived, got, listed = await asyncio.gather(
        cli("key", "--prefix", "shop", "--jmespath", "order_id", stdin='{"order_id": 9}'),
        cli("get", "--store", url, str(key), "--json", "--show-response"),
        cli("list", "--store", url),
    )
    assert derived.ok().strip() == key
    record = got.json()
    assert record["status"] == "COMPLETED" and record["response"] == {"ok": 1}
    assert "list is not supported for redis:// stores" in listed.error()
    released = await cli("release", "--store", url, str(key), "--yes", "--json")
    assert json.loads(released.ok())["deleted"]["key"] == key
    gone = await cli("get", "--store", url, str(key))
    assert "no record" in gone.error(code=3)
