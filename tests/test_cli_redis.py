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
from _redis import redis_cluster, redis_server  # noqa: E402, F401  (fixtures)


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
    rows = listed.ok().splitlines()
    assert rows[1:] == [row for row in rows[1:] if row.endswith(str(key))] and len(rows) == 2
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


async def _write(store: Any, key: str, response: Any, *, complete: bool = True) -> None:
    now = time.time()
    await store.claim(Claim(key, "owner-1", now, lease=300, ttl=3600))
    if complete:
        encoded = json.dumps(response).encode()
        await store.complete(Completion(key, "owner-1", now, 3600, None, encoded, response))


@pytest.mark.parametrize("cluster", [False, True], ids=["server", "cluster"])
async def test_list_on_redis_scans_the_prefix_bounded_and_streamed(
    cluster: bool, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue("redis_cluster" if cluster else "redis_server")
    prefix = f"cli{uuid.uuid4().hex[:8]}:"
    url = f"{server.url}/0?key_prefix={prefix}" + ("&cluster=true" if cluster else "")
    store = redis_store.RedisStore.from_url(server.url, key_prefix=prefix, cluster=cluster)
    other = redis_store.RedisStore.from_url(server.url, key_prefix="x" + prefix, cluster=cluster)
    client = server.cluster_client() if cluster else server.client()
    try:
        done = [f"shop#done{i}" for i in range(5)]
        for key in done:
            await _write(store, key, {"ok": key})
        await _write(store, "shop#held", None, complete=False)
        await _write(other, "shop#elsewhere", "no")  # another prefix: never listed
        await client.set(f"{prefix}stray", "not a record")  # under the prefix, unreadable
        await client.hset(f"{prefix}ahash", "a", "b")  # another type: not scanned
        s = ("--store", url)
        everything, held, limited = await asyncio.gather(
            cli("list", *s, "--json"),
            cli("list", *s, "--status", "INPROGRESS"),
            cli("list", *s, "--limit", "2", "--page-size", "1", "--progress"),
        )
    finally:
        await store.aclose()
        await other.aclose()
        await client.aclose()
    listed = [json.loads(line) for line in everything.ok().splitlines()]
    assert sorted(record["key"] for record in listed) == sorted([*done, "shop#held"])
    assert "skipped 'stray'" in everything.err and "6 records" in everything.err
    assert held.ok().splitlines()[1:] == [
        row for row in held.out.splitlines()[1:] if row.endswith("shop#held")
    ]
    assert len(held.out.splitlines()) == 2
    assert len(limited.ok().splitlines()) == 1 + 2
    # One key per page, stopped at the limit: at most the pages it needed were read.
    assert limited.err.splitlines()[-1].startswith("2 records shown, stopped at --limit 2: ")
    assert "items read" in limited.err


async def test_list_limit_on_redis_reads_what_it_shows(redis_server: Any) -> None:  # noqa: F811
    prefix = f"cli{uuid.uuid4().hex[:8]}:"
    url = f"{redis_server.url}/0?key_prefix={prefix}"
    store = redis_store.RedisStore.from_url(redis_server.url, key_prefix=prefix)
    try:
        for i in range(5):
            await _write(store, f"shop#{i}", {"ok": i})
        two, five = await asyncio.gather(
            cli("list", "--store", url, "--limit", "2"),
            cli("list", "--store", url, "--limit", "5"),
        )
    finally:
        await store.aclose()
    # Records are read limit + 1 at a time (not a SCAN COUNT's 100): the extra one says
    # more remain.
    assert len(two.ok().splitlines()) == 1 + 2
    assert two.err == "2 records shown, stopped at --limit 2: more remain (read 3 items)\n"
    assert len(five.ok().splitlines()) == 1 + 5
    assert five.err == "5 records (read 5 items)\n"


async def test_powertools_format_records_are_addressable(redis_server: Any) -> None:  # noqa: F811
    prefix = f"cli{uuid.uuid4().hex[:8]}:"
    store = redis_store.RedisStore.from_url(
        redis_server.url, key_prefix=prefix, record_format="powertools-python"
    )
    response = {"charge_id": "ch_1", "amount": 5}
    try:
        await _write(store, "shop#python", response)
    finally:
        await store.aclose()
    url = f"{redis_server.url}/0?key_prefix={prefix}"
    right, human, wrong, hinted, bad = await asyncio.gather(
        cli(
            "get",
            "--store",
            f"{url}&record_format=powertools-python",
            "shop#python",
            "--show-response",
            "--json",
        ),
        cli(
            "get",
            "--store",
            f"{url}&record_format=powertools-python",
            "shop#python",
            "--show-response",
        ),
        cli("get", "--store", url, "shop#python", "--show-response", "--json"),
        cli("get", "--store", url, "shop#python", "--show-response"),
        cli("get", "--store", f"{url}&record_format=python", "shop#python"),
    )
    assert right.json()["response"] == response
    assert '  "charge_id": "ch_1",' in human.ok().splitlines()
    assert wrong.json()["response"] == json.dumps(response)  # read as the other layout
    assert "add record_format=powertools-python" in hinted.ok()
    assert "record_format" not in human.out  # decoded: no hint
    assert "record_format= in the store URL must be one of" in bad.error()
