"""An abandoned renewal on each client the stores use: aioboto3 (moto), the light DynamoDB
transport, redis-py, asyncpg and psycopg 3, each through a loopback proxy that delays one
answer (the fault injector) and with a single connection, so a connection left with an
unread answer would be reused.

The renewal abandons the ``extend`` whose answer is late (it is cancelled: the client
closes that connection) and sends the next one on time; every later request on that client
— the next renewals, the completion, the reads after the call — gets its own answer, and
the call does not wait for the late one.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _moto import fresh_table, new_session, open_client, open_light_client
from _postgres import PostgresServer, fresh_table_name
from _redis import RedisServer
from _tcp_proxy import LossyProxy, lossy_proxy
from aiobotocore.config import AioConfig
from support import RecordingStore

from idempotency_async import Event, Manager, Options, Renewal
from idempotency_async.record import Claim, Status
from idempotency_async.stores.base import Extended, Store
from idempotency_async.stores.dynamodb import DynamoDBStore
from idempotency_async.stores.postgres import PostgresStore, create_table
from idempotency_async.stores.redis import RedisStore

CLIENTS = ["aioboto3", "light", "redis", "asyncpg", "psycopg"]
RENEW = 1.0
EVERY = 0.25
WORK = 1.1  # four renewals: the first is abandoned, the next ones must be confirmed
LATE = 5.0  # the delayed answer: far past the call (a client that waited would be cut off)


def _server_port(client: str, request: pytest.FixtureRequest) -> int:
    if client in ("aioboto3", "light"):
        endpoint: str = request.getfixturevalue("moto_endpoint")
        return int(endpoint.rsplit(":", 1)[1])
    if client == "redis":
        redis_server: RedisServer = request.getfixturevalue("redis_server")
        return redis_server.port
    postgres_server: PostgresServer = request.getfixturevalue("postgres_server")
    return postgres_server.port


@contextlib.asynccontextmanager
async def _store_through(
    client: str, proxy: LossyProxy, request: pytest.FixtureRequest
) -> AsyncIterator[Store]:
    """A store whose client reaches its server through ``proxy``, on one connection."""
    via = f"127.0.0.1:{proxy.port}"
    if client in ("aioboto3", "light"):
        endpoint = request.getfixturevalue("moto_endpoint")
        async with open_client(endpoint) as admin:  # creates the table, directly
            table = await fresh_table(admin)
        if client == "light":
            opened: Any = open_light_client(f"http://{via}", max_connections=1)
        else:
            config = AioConfig(max_pool_connections=1, connect_timeout=5, read_timeout=30)
            opened = new_session().client("dynamodb", endpoint_url=f"http://{via}", config=config)
        async with opened as dynamodb:
            yield DynamoDBStore(dynamodb, table_name=table)
    elif client == "redis":
        import redis.asyncio as redis_asyncio

        redis = redis_asyncio.Redis(host="127.0.0.1", port=proxy.port, max_connections=1)
        store = RedisStore(redis, key_prefix=f"t{uuid.uuid4().hex[:10]}:")
        try:
            await store.load_scripts()
            yield store
        finally:
            await store.aclose()
            await redis.aclose()
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        dsn = f"postgres://postgres@{via}/postgres"
        table = fresh_table_name()
        if client == "asyncpg":
            import asyncpg

            pool: Any = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
            closing: Any = pool.close
        else:
            from psycopg_pool import AsyncConnectionPool

            pool = AsyncConnectionPool(
                dsn, kwargs={"autocommit": True}, min_size=1, max_size=1, open=False
            )
            await pool.open()
            closing = pool.close
        try:
            admin = await server.connect()
            try:
                await create_table(admin, table=table)
            finally:
                await admin.close()
            yield PostgresStore(pool, table=table)
        finally:
            await closing()


class _DelaysFirstExtend(RecordingStore):
    """Arms the proxy just before the first ``extend``: its answer comes ``LATE`` seconds
    late.  Records every extend's answer."""

    def __init__(self, inner: Store, proxy: LossyProxy) -> None:
        super().__init__(inner)
        self.proxy = proxy
        self.outcomes: dict[int, Extended | BaseException] = {}

    @property
    def renewals(self) -> list[Extended | BaseException]:
        """Each extend's outcome, in the order they were sent."""
        return [self.outcomes[nth] for nth in sorted(self.outcomes)]

    async def extend(self, claim: Claim) -> Extended:
        nth = self.calls.count("extend")
        if nth == 0:
            self.proxy.delay_answers(1, LATE)
        try:
            answer = await super().extend(claim)
        except BaseException as exc:
            self.outcomes[nth] = exc
            raise
        self.outcomes[nth] = answer
        return answer


@pytest.mark.parametrize("client", CLIENTS)
async def test_an_abandoned_renewal_leaves_nothing_unread_on_its_client(
    client: str, request: pytest.FixtureRequest
) -> None:
    async with (
        lossy_proxy(_server_port(client, request)) as proxy,
        _store_through(client, proxy, request) as store,
    ):
        delayed = _DelaysFirstExtend(store, proxy)
        events: list[Event] = []
        manager = Manager(
            delayed,
            Options(
                key_prefix="abandoned",
                renewal=Renewal(lease=RENEW, every=EVERY),
                on_event=events.append,
            ),
        )
        loop = asyncio.get_running_loop()

        async def work() -> dict[str, str]:
            await asyncio.sleep(WORK)
            return {"client": client}

        started = loop.time()
        assert await manager.execute({"id": client}, work, timeout=30) == {"client": client}
        elapsed = loop.time() - started

        # The late answer was abandoned, not waited for: the call took its work's time.
        assert proxy.answers_delayed == 1
        assert elapsed < LATE - 1.0
        failed = [event for event in events if event.kind == "renew_failed"]
        assert len(failed) == 1 and isinstance(failed[0].error, TimeoutError)
        # The first renewal was cancelled; the ones after it got their own answers (but one
        # still in flight when the call ended, cancelled then).
        assert isinstance(delayed.renewals[0], asyncio.CancelledError)
        confirmed = delayed.renewals[1:]
        if isinstance(confirmed[-1], asyncio.CancelledError):
            confirmed.pop()
        assert len(confirmed) >= 2 and all(answer is Extended.RENEWED for answer in confirmed)
        # And so do the requests after the call, on the same client.
        key = manager.key_for({"id": client})
        assert key is not None
        verdict = await store.get(key, now=manager.options.clock())
        assert verdict.record is not None and verdict.record.status is Status.COMPLETED
        assert verdict.record.response == {"client": client}
        deleted = await store.force_release(key)
        assert deleted is not None and deleted.response == {"client": client}
        assert (await store.get(key, now=manager.options.clock())).record is None
