"""A record for another key than the one asked is never an answer, on every store.

A store answers about one key; a proxy that mixes answers up, a connection left with
somebody else's answer, a key column that compares keys loosely, or a bug can hand it the
record of another key.  Read as the asked key's, a completed record would replay another
request's response.  Each store is driven through its real server with the fault in front
of it (a hostile proxy on loopback for Redis, a table with a case-insensitive key column for
Postgres, a store that answers wrongly for the manager); the DynamoDB transports are
covered in ``tests/test_dynamodb_light.py`` against a hostile endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from _postgres import PostgresServer, fresh_table_name, postgres_server
from _redis import RedisServer, redis_server
from support import MemoryWrapper

from idempotency_async import Manager, Options
from idempotency_async.errors import InconsistentStateError
from idempotency_async.record import Claim, Completion, Record
from idempotency_async.stores.base import Found, Verdict
from idempotency_async.stores.redis import RedisStore

__all__ = ["postgres_server", "redis_server"]

NOW = 1_700_000_000.0
TTL = 3600.0


def _claim(key: str, owner: str = "writer") -> Claim:
    return Claim(key, owner, NOW, 30.0, TTL, None)


def _completion(key: str, owner: str = "writer") -> Completion:
    response = {"for": key}
    return Completion(key, owner, NOW, TTL, None, orjson.dumps(response), response)


async def _complete(store: Any, key: str) -> None:
    claimed = await store.claim(_claim(key))
    assert claimed.found is Found.CLAIMED
    await store.complete(_completion(key))


# ---------------------------------------------------------------------- any store (manager)


class _AnswersAboutAnotherKey(MemoryWrapper):
    """A MemoryStore with a bug: once ``wrong`` is set, an answer that carries a record
    carries the last record it answered with before, whatever key was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.wrong = False
        self.last: Record | None = None

    def _answer(self, verdict: Verdict) -> Verdict:
        if verdict.record is None:
            return verdict
        if self.wrong and self.last is not None:
            return verdict._replace(record=self.last)
        self.last = verdict.record
        return verdict

    async def claim(self, claim: Claim) -> Verdict:
        return self._answer(await self.inner.claim(claim))

    async def get(self, key: str, *, now: float) -> Verdict:
        return self._answer(await self.inner.get(key, now=now))


@pytest.mark.parametrize("how", ["execute", "replay"])
async def test_the_manager_refuses_a_record_for_another_key(how: str) -> None:
    store = _AnswersAboutAnotherKey()
    manager = Manager(store, Options(key_prefix="p"))

    async def charge(order: int) -> dict[str, int]:
        return {"charged": order}

    assert await manager.execute({"id": 1}, lambda: charge(1), timeout=5) == {"charged": 1}
    assert await manager.execute({"id": 2}, lambda: charge(2), timeout=5) == {"charged": 2}
    assert await manager.execute({"id": 1}, lambda: charge(1), timeout=5) == {"charged": 1}
    store.wrong = True
    # The store now hands key 2 the record of key 1: never replayed as key 2's.
    with pytest.raises(InconsistentStateError, match="record of key"):
        if how == "execute":
            await manager.execute({"id": 2}, lambda: charge(2), timeout=5)
        else:
            await manager.replay({"id": 2}, default=None)


# ---------------------------------------------------------------------- Redis


class _RespStaleProxy:
    """A loopback proxy in front of redis-server that, once ``stale`` is set, answers each
    command with the reply to the command before it (RESP2 replies, parsed whole)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.stale = False
        self._last: bytes | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> _RespStaleProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
        try:
            async with asyncio.TaskGroup() as pipes:
                pipes.create_task(_pipe(reader, upstream))
                pipes.create_task(self._replies(upstream_reader, client))
        except* (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            for writer in (upstream, client):
                writer.close()
            for writer in (upstream, client):
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _replies(self, reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        while True:
            reply = await _resp(reader)
            sent = reply
            if self.stale and self._last is not None:
                sent = self._last
            self._last = reply
            client.write(sent)
            await client.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    raise OSError("closed")


async def _resp(reader: asyncio.StreamReader) -> bytes:
    """One whole RESP2 reply, as its bytes."""
    line = await reader.readuntil(b"\r\n")
    kind, rest = line[:1], line[1:-2]
    if kind == b"$" and int(rest) >= 0:
        return line + await reader.readexactly(int(rest) + 2)
    if kind == b"*" and int(rest) > 0:
        parts = [line]
        for _ in range(int(rest)):
            parts.append(await _resp(reader))
        return b"".join(parts)
    return line


@contextlib.asynccontextmanager
async def _redis_through(proxy: _RespStaleProxy) -> AsyncIterator[RedisStore]:
    import redis.asyncio as redis_asyncio

    client = redis_asyncio.Redis(host="127.0.0.1", port=proxy.port, max_connections=1)
    store = RedisStore(client, key_prefix=f"t{uuid.uuid4().hex[:8]}:")
    try:
        await store.load_scripts()
        yield store
    finally:
        await client.aclose()


@pytest.mark.parametrize("operation", ["get", "claim", "force_release"])
async def test_redis_refuses_an_answer_about_another_key(
    redis_server: RedisServer, operation: str
) -> None:
    async with _RespStaleProxy(redis_server.port) as proxy, _redis_through(proxy) as store:
        for key in ("k#A", "k#B"):
            await _complete(store, key)

        async def ask(key: str) -> Any:
            if operation == "get":
                return (await store.get(key, now=NOW)).record
            if operation == "claim":
                return (await store.claim(_claim(key, "another"))).record
            return await store.force_release(key)

        first = await ask("k#A")
        assert first is not None and first.response == {"for": "k#A"}
        proxy.stale = True  # the next command gets the reply above, about k#A
        with pytest.raises(InconsistentStateError, match="k#A"):
            await ask("k#B")


# ---------------------------------------------------------------------- Postgres


async def _case_insensitive_table(server: PostgresServer) -> tuple[Any, str]:
    """A pool and a table like the store's, but whose key column ignores case: the base64
    keys 'p#aB…' and 'p#Ab…' then find each other's row."""
    pool = await server.pool()
    table = fresh_table_name()
    from idempotency_async.stores.postgres import table_sql

    collation = f"ci_{table}"
    await pool.execute(
        f"CREATE COLLATION {collation} (provider = icu, locale = 'und-u-ks-level2', "
        "deterministic = false)"
    )
    # The whole schema (the claim function included), the key column collated.
    await pool.execute(
        table_sql(table).replace(
            "key text PRIMARY KEY", f'key text COLLATE "{collation}" PRIMARY KEY'
        )
    )
    return pool, table


@pytest.mark.parametrize("operation", ["get", "claim", "force_release"])
async def test_postgres_refuses_the_row_of_another_key(
    postgres_server: PostgresServer, operation: str
) -> None:
    from idempotency_async.stores.postgres import PostgresStore

    pool, table = await _case_insensitive_table(postgres_server)
    try:
        store = PostgresStore(pool, table=table, judged_by="client")
        await _complete(store, "p#Ab")
        assert (await store.get("p#Ab", now=NOW)).record is not None  # its own row is fine
        with pytest.raises(InconsistentStateError, match=r"'p#aB'.*'p#Ab'"):
            if operation == "get":
                await store.get("p#aB", now=NOW)
            elif operation == "claim":
                await store.claim(_claim("p#aB", "another"))
            else:
                await store.force_release("p#aB")
    finally:
        await pool.close()


async def test_a_transactional_claim_refuses_the_row_of_another_key(
    postgres_server: PostgresServer,
) -> None:
    from idempotency_async.stores.postgres import PostgresStore

    pool, table = await _case_insensitive_table(postgres_server)
    try:
        store = PostgresStore(pool, table=table)  # the server's clock, as transactions use
        await _complete(store, "p#Ab")  # live: read, and refused
        await pool.execute(  # expired: taken over by the claim, and refused
            f'INSERT INTO "{table}" (key, status, owner, expires_at) '
            "VALUES ('q#Ab', 'COMPLETED', 'old', now() - interval '1 hour')"
        )
        async with pool.acquire() as conn:
            for asked, found in (("p#aB", "p#Ab"), ("q#aB", "q#Ab")):
                transaction = conn.transaction()
                await transaction.start()
                try:
                    bound = await store.transaction_store(conn)
                    with pytest.raises(InconsistentStateError, match=f"'{asked}'.*'{found}'"):
                        await bound.claim_within(_claim(asked, "another"), 0.0)
                finally:
                    await transaction.rollback()
    finally:
        await pool.close()


async def test_a_claim_answered_about_another_key_is_released_as_unknown(
    redis_server: RedisServer,
) -> None:
    # The claim's own answer was not the one read (the proxy held it back): it may have
    # applied.  Like any claim whose outcome is unknown it gets its owner-fenced release,
    # so the key is not blocked for the whole lease by a claim nobody holds.
    ran: list[int] = []

    async def charge(order: int) -> dict[str, int]:
        ran.append(order)
        return {"charged": order}

    async with _RespStaleProxy(redis_server.port) as proxy, _redis_through(proxy) as store:
        manager = Manager(store, Options(key_prefix="p"))
        await manager.execute({"id": 1}, lambda: charge(1), timeout=30)
        assert await manager.execute({"id": 1}, lambda: charge(1), timeout=30) == {"charged": 1}
        proxy.stale = True  # the next claim reads the conflict answer above, about key 1
        with pytest.raises(InconsistentStateError):
            await manager.execute({"id": 2}, lambda: charge(2), timeout=30)
        client = redis_server.client()
        try:
            direct = RedisStore(client, key_prefix=store.key_prefix)
            left = await direct.get(str(manager.key_for({"id": 2})), now=NOW)
        finally:
            await client.aclose()
    assert ran == [1]
    assert left.record is None  # the claim applied, and was released
