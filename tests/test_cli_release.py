"""``idempotency-async release`` removes exactly the record it showed, on every store URL.

The operator reads the record and answers ``y``; meanwhile the key may change hands (a new
call claims a lapsed lease) or state (the holder completes).  Deleting then would remove a
record nobody confirmed — a new owner's claim, or a completed record whose deletion lets a
retry run the side effect again.  The command runs as operators run it (a subprocess of
this checkout) and the change happens while it waits for the answer; the conditional
delete under it (each store's ``release_exactly``) runs against moto, redis-server and
postgres.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from _cli import ROOT, cli, cli_env
from _moto import REGION, moto_endpoint, open_client
from _postgres import PostgresServer, fresh_table_name, postgres_server
from _redis import RedisServer, redis_server

from idempotency_async.record import Claim, Completion, Status
from idempotency_async.stores.base import Found, Stepped, StepWrite
from idempotency_async.stores.dynamodb import DynamoDBStore, create_table
from idempotency_async.stores.postgres import PostgresStore
from idempotency_async.stores.postgres import create_table as create_sql_table
from idempotency_async.stores.redis import RedisStore

__all__ = ["moto_endpoint", "postgres_server", "redis_server"]

KEY = "shop#release-me"
TTL = 3600.0


@contextlib.asynccontextmanager
async def _store(backend: str, request: pytest.FixtureRequest) -> AsyncIterator[tuple[Any, str]]:
    """A store of ``backend`` for the test to act on, and the URL the command gets."""
    if backend == "dynamodb":
        endpoint = request.getfixturevalue("moto_endpoint")
        table = f"cli-{uuid.uuid4().hex[:12]}"
        async with open_client(endpoint) as client:
            await create_table(client, table)
            yield (
                DynamoDBStore(client, table_name=table),
                f"dynamodb://{table}?region={REGION}&endpoint={quote(endpoint, safe='')}",
            )
    elif backend == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        prefix = f"cli{uuid.uuid4().hex[:8]}:"
        async with RedisStore.from_url(server.url, key_prefix=prefix) as store:
            yield store, f"{server.url}/0?key_prefix={prefix}"
    else:
        postgres: PostgresServer = request.getfixturevalue("postgres_server")
        table = fresh_table_name()
        await create_sql_table(postgres.dsn, table=table)
        async with PostgresStore.from_url(postgres.dsn, table=table) as store:
            yield store, f"{postgres.dsn}?table={table}"


async def _claim(store: Any, owner: str, lease: float) -> None:
    verdict = await store.claim(Claim(KEY, owner, time.time(), lease, TTL, "v"))
    assert verdict.found is Found.CLAIMED, verdict


async def _complete(store: Any, owner: str) -> None:
    response = {"charged": 12.5}
    await store.complete(
        Completion(KEY, owner, time.time(), TTL, "v", orjson.dumps(response), response)
    )


async def _release_answering_yes_after(url: str, meanwhile: Callable[[], Awaitable[None]]) -> Any:
    """Run ``release`` and answer ``y`` once ``meanwhile`` ran: (exit code, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "idempotency_async", "release", "--store", url, KEY),
        cwd=ROOT,
        env=cli_env(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stderr is not None
    shown = await asyncio.wait_for(process.stderr.readuntil(b"[y/N] "), 60)
    await meanwhile()
    process.stdin.write(b"y\n")
    await process.stdin.drain()
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, out.decode(), (shown + err).decode()


BACKENDS = ["dynamodb", "redis", "postgres"]


# The command is the same on every store URL (each store's release_exactly is tested on all
# three below): one store here keeps the subprocesses few.
@pytest.mark.parametrize("backend", ["redis"])
async def test_release_deletes_nothing_once_a_new_call_claimed_the_key(
    backend: str, request: pytest.FixtureRequest
) -> None:
    async with _store(backend, request) as (store, url):
        await _claim(store, "crashed-holder", lease=0.2)
        await asyncio.sleep(0.5)  # its lease lapsed: the operator is asked about that record

        async def new_call_claims() -> None:
            await _claim(store, "new-holder", lease=60)

        code, out, err = await _release_answering_yes_after(url, new_call_claims)
        assert "crashed-holder" in err  # what the operator saw
        assert code == 1 and out == "", err
        assert "changed" in err and "Traceback" not in err
        record = (await store.get(KEY, now=time.time())).record
    # The new owner's claim is intact: its callback runs once, not twice.
    assert record is not None and record.owner == "new-holder"


# DynamoDB: tests/test_cli.py answers y; every store's release_exactly: the test below.
@pytest.mark.parametrize("backend", ["redis"])
async def test_release_deletes_the_record_it_showed(
    backend: str, request: pytest.FixtureRequest
) -> None:
    async with _store(backend, request) as (store, url):
        await _claim(store, "holder", lease=30.123456)  # a lease end that is not whole
        code, out, err = await _release_answering_yes_after(url, lambda: asyncio.sleep(0))
        assert code == 0, err
        assert "deleted:" in out and "holder" in out
        assert (await store.get(KEY, now=time.time())).record is None


ONE = '[["create_order",{"id":"o1"}]]'
TWO = '[["create_order",{"id":"o1"}],["charge",{"id":"ch_1"}]]'


async def _step(
    store: Any, owner: str, position: int, steps: str, now: float | None = None
) -> None:
    now = time.time() if now is None else now
    written = await store.record_step(StepWrite(KEY, owner, now, TTL, position, steps))
    assert written is Stepped.RECORDED


async def _renew(store: Any, owner: str) -> None:
    assert await store.extend(Claim(KEY, owner, time.time(), 90.0, TTL, "v"))


_CHANGES: dict[str, tuple[float, Callable[[Any], Awaitable[None]]]] = {
    # (the holder's lease, what happens after the record was read)
    "claimed by a new call": (0.2, lambda store: _claim(store, "new-holder", lease=60)),
    "completed by its holder": (60, lambda store: _complete(store, "holder")),
    "renewed by its holder": (60, lambda store: _renew(store, "holder")),
    "released by its holder": (60, lambda store: store.release(KEY, "holder")),
    "a step recorded by its holder": (60, lambda store: _step(store, "holder", 0, ONE)),
}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_release_exactly_refuses_any_change_and_takes_the_record_as_read(
    backend: str, request: pytest.FixtureRequest
) -> None:
    async with _store(backend, request) as (store, _):
        for change, (lease, act) in _CHANGES.items():
            await _claim(store, "holder", lease=lease)
            await asyncio.sleep(0.4 if lease < 1 else 0)
            shown = (await store.get(KEY, now=time.time())).record
            assert shown is not None
            await act(store)
            after = (await store.get(KEY, now=time.time())).record
            assert not await store.release_exactly(shown), change
            assert (await store.get(KEY, now=time.time())).record == after, change
            await store.force_release(KEY)
        # Unchanged, in progress or completed (no lease end): deleted.
        await _claim(store, "holder", lease=30.5)
        shown = (await store.get(KEY, now=time.time())).record
        assert await store.release_exactly(shown)
        await _claim(store, "holder", lease=30)
        await _complete(store, "holder")
        shown = (await store.get(KEY, now=time.time())).record
        assert shown is not None and shown.status is Status.COMPLETED
        assert await store.release_exactly(shown)
        assert (await store.get(KEY, now=time.time())).record is None


async def test_a_record_that_cannot_be_shown_needs_yes(request: pytest.FixtureRequest) -> None:
    async with _store("redis", request) as (store, url):
        await store._client.set(store.key_prefix + KEY, b"not json")
        asked = await cli("release", "--store", url, KEY, stdin="y\n")
        assert "pass --yes" in asked.error()
        assert await store._client.get(store.key_prefix + KEY) == b"not json"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_release_exactly_refuses_a_step_recorded_since_it_was_shown(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """A record shown with its steps is deleted only while it holds those steps: a step the
    holder recorded meanwhile (whose effect a retry would repeat) was never confirmed."""
    # Over 64 KB of UTF-8: DynamoDB keeps such a list compressed.
    big = '[["create_order",{"id":"o1","note":"' + "é" * 40_000 + '"}]]'
    bigger = big[:-1] + ',["charge",{"id":"ch_1"}]]'
    async with _store(backend, request) as (store, _):
        for first, second in [(ONE, TWO), (big, bigger)]:
            await _claim(store, "holder", lease=60)
            await _step(store, "holder", 0, first)
            shown = (await store.get(KEY, now=time.time())).record
            assert shown is not None and shown.steps == first
            await _step(store, "holder", 1, second)
            assert not await store.release_exactly(shown)
            after = (await store.get(KEY, now=time.time())).record
            assert after is not None and after.steps == second
            assert await store.release_exactly(after)
            assert (await store.get(KEY, now=time.time())).record is None


@pytest.mark.parametrize("backend", BACKENDS)
async def test_release_deletes_nothing_once_the_holder_recorded_another_step(
    backend: str, request: pytest.FixtureRequest
) -> None:
    async with _store(backend, request) as (store, url):
        await _claim(store, "holder", lease=60)
        first = time.time()
        await _step(store, "holder", 0, ONE, now=first)

        async def holder_records_a_step() -> None:
            # The client's clock of the first step (DynamoDB's expiry is the client's): the
            # expiry stays, and only the steps tell the records apart.
            await _step(store, "holder", 1, TWO, now=first)

        code, out, err = await _release_answering_yes_after(url, holder_records_a_step)
        assert "1 recorded: create_order" in err  # what the operator saw
        assert code == 1 and out == "", err
        assert "changed" in err and "Traceback" not in err
        record = (await store.get(KEY, now=time.time())).record
    assert record is not None and record.steps == TWO


@pytest.mark.postgres
async def test_postgres_release_exactly_compares_the_whole_step_list_not_what_it_read(
    postgres_server: PostgresServer,
) -> None:
    """The operator's store reads a step list cut at its bound (a worker with a larger
    ``max_response_bytes`` wrote it): a step recorded after it is past the cut, and the
    record still is not the one shown."""
    table = fresh_table_name()
    await create_sql_table(postgres_server.dsn, table=table)
    long = '[["create_order",{"note":"' + "x" * 3000 + '"}]]'
    longer = long[:-1] + ',["charge",{"id":"ch_1"}]]'
    async with (
        PostgresStore.from_url(postgres_server.dsn, table=table) as worker,
        PostgresStore.from_url(postgres_server.dsn, table=table, max_response_bytes=100) as cli,
    ):
        await _claim(worker, "holder", lease=60)
        await _step(worker, "holder", 0, long)
        shown = (await cli.get(KEY, now=time.time())).record
        assert shown is not None and shown.steps is not None and shown.steps != long
        await _step(worker, "holder", 1, longer)
        assert not await cli.release_exactly(shown)
        assert (await worker.get(KEY, now=time.time())).record is not None
