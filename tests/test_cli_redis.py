"""The ``idempotency-async`` command on ``redis://`` stores, against a real redis-server."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from typing import Any

import pytest
from _cli import cli

from idempotency_async import Manager, Options
from idempotency_async.record import Claim, Completion

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


# Sequences a terminal would act on: OSC 52 (write the clipboard), a title, clear screen,
# a C1 CSI, DEL, a bidi override.
HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;owned\x07\x1b[2J\x9b31m\x7f\u202e"


def _raw(text: str) -> list[str]:
    return [char for char in "\x1b\x07\x9b\x7f\u202e" if char in text]


async def test_get_escapes_control_characters_and_json_stays_exact(redis_server: Any) -> None:  # noqa: F811
    prefix = f"cli{uuid.uuid4().hex[:8]}:"
    store = redis_store.RedisStore.from_url(redis_server.url, key_prefix=prefix)
    http = {
        "v": 1,
        "status": 200,
        "headers": [["content-type", "text/plain"], ["x-echo", f"hi{HOSTILE}"]],
        "body_b64": base64.b64encode(f"line 1\r\nyou said: {HOSTILE}\n".encode()).decode(),
    }
    plain = {"echo": HOSTILE}
    now = time.time()
    try:
        for key, response in ((f"shop#http{HOSTILE}", http), ("shop#plain", plain)):
            owner = f"owner{HOSTILE}"
            await store.claim(Claim(key, owner, now, lease=300, ttl=3600))
            encoded = json.dumps(response).encode()
            await store.complete(Completion(key, owner, now, 3600, None, encoded, response))
    finally:
        await store.aclose()
    url = f"{redis_server.url}/0?key_prefix={prefix}"
    shown, shown_plain, as_json = await asyncio.gather(
        cli("get", "--store", url, f"shop#http{HOSTILE}", "--show-response"),
        cli("get", "--store", url, "shop#plain", "--show-response"),
        cli("get", "--store", url, f"shop#http{HOSTILE}", "--show-response", "--json"),
    )
    for run in (shown, shown_plain):
        assert _raw(run.ok()) == [], run.out
        assert "\\x1b]52;c;cm0gLXJmIH4=\\x07" in run.out and "\\x9b31m\\x7f\\u202e" in run.out
    lines = shown.out.splitlines()
    assert (
        lines[0].startswith("key         shop#http\\x1b]52")
        and "owner       owner\\x1b]52" in shown.out
    )
    assert "HTTP 200" in lines and "line 1" in lines  # CRLF bodies still read as lines
    assert any(line.startswith("x-echo: hi\\x1b]52") for line in lines)
    assert _raw(as_json.ok()) == []  # JSON escapes them itself, and stays exact
    record = json.loads(as_json.out)
    assert record["response"] == http and record["owner"] == f"owner{HOSTILE}"


async def test_release_with_stdin_closed_on_redis_keeps_the_record(redis_server: Any) -> None:  # noqa: F811
    prefix = f"cli{uuid.uuid4().hex[:8]}:"
    store = redis_store.RedisStore.from_url(redis_server.url, key_prefix=prefix)
    try:
        await store.claim(Claim("shop#held", "owner-1", time.time(), lease=300, ttl=3600))
        url = f"{redis_server.url}/0?key_prefix={prefix}"
        closed = await cli("release", "--store", url, "shop#held", close_stdin=True)
        assert "stdin is closed" in closed.error()
        still = await store.get("shop#held", now=time.time())
        assert still.record is not None and still.record.owner == "owner-1"
    finally:
        await store.aclose()
