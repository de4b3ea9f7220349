"""examples/steps_fastapi_postgres.py as real servers (uvicorn) on the real postgres: the
payment provider in a process of its own, and shop instances sharing one database.

After a request that fails after the charge, a shop process that dies inside the order's
transactional step or inside the charge step, and a client that gives up mid-request, the
client's retry leaves one order row, one charge at the provider and one receipt in the
outbox; concurrent duplicates run the steps once; another body with the same key is 422.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from _postgres import PostgresServer, fresh_table_name
from test_examples_http import running

# A connection per request: the example servers close an idle keep-alive connection after
# 5 s (uvicorn's default), and a loaded machine can take that long between two requests,
# which then meets the closing connection (httpx.ReadError, not the library's doing).
_FRESH = httpx.Limits(max_keepalive_connections=0)

pytestmark = pytest.mark.postgres

EXAMPLE = "steps_fastapi_postgres.py"
LEASE = 3.0  # the shop's short lease: how long a dead process blocks its key


@dataclass
class Deployment:
    """The provider, the shop's tables, and the environment a shop instance runs with."""

    postgres: PostgresServer
    provider: str
    env: dict[str, str]

    async def provider_requests(self) -> dict[str, int]:
        async with httpx.AsyncClient() as client:
            answer = (await client.get(f"{self.provider}/charges")).json()
        assert set(answer["charges"]) == set(answer["requests"])
        requests: dict[str, int] = answer["requests"]
        return requests

    async def rows(self) -> tuple[list[Any], list[Any], list[Any]]:
        """Orders, outbox rows, idempotency records."""
        connection = await self.postgres.connect()
        try:
            return (
                await connection.fetch(f"SELECT * FROM {self.env['ORDERS_TABLE']}"),
                await connection.fetch(f"SELECT * FROM {self.env['OUTBOX_TABLE']}"),
                await connection.fetch(
                    f"SELECT status, step_count FROM {self.env['IDEMPOTENCY_TABLE']}"
                ),
            )
        finally:
            await connection.close()


@asynccontextmanager
async def deployment(postgres: PostgresServer) -> AsyncIterator[Deployment]:
    async with running(EXAMPLE, {"ROLE": "provider"}) as provider:
        env = {
            "DATABASE_URL": postgres.dsn,
            "IDEMPOTENCY_TABLE": fresh_table_name(),
            "ORDERS_TABLE": fresh_table_name(),
            "OUTBOX_TABLE": fresh_table_name(),
            "PROVIDER_URL": provider,
            "LEASE_SECONDS": str(LEASE),
            "DEMO_FAULTS": "1",
        }
        yield Deployment(postgres, provider, env)


CART = {"sku": "A1", "qty": 2, "amount": 4200}


def _headers(key: str, **more: str) -> dict[str, str]:
    return {"Idempotency-Key": key, "X-API-Key": "alice", **more}


async def _check_one_of_each(shop: Deployment, answer: httpx.Response) -> None:
    assert answer.status_code == 201, answer.text
    body = answer.json()
    orders, outbox, records = await shop.rows()
    assert [row["id"] for row in orders] == [body["order"]]
    assert orders[0]["charge"] == body["charge"]
    assert [(row["id"], row["order_id"]) for row in outbox] == [(body["receipt"], body["order"])]
    assert [(row["status"], row["step_count"]) for row in records] == [("COMPLETED", None)]


async def test_a_request_failing_after_the_charge_resumes_at_the_receipt(
    postgres_server: PostgresServer,
) -> None:
    async with deployment(postgres_server) as shop, running(EXAMPLE, shop.env) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=_FRESH) as client:
            failed = await client.post(
                "/orders", json=CART, headers=_headers("k-1", **{"X-Demo-Fault": "after-charge"})
            )
            assert failed.status_code == 500
            orders, outbox, records = await shop.rows()
            # The order committed with its recovery point; the charge was recorded too.
            assert len(orders) == 1 and orders[0]["charge"] is None and outbox == []
            assert [(row["status"], row["step_count"]) for row in records] == [("INPROGRESS", 2)]

            resumed = await client.post("/orders", json=CART, headers=_headers("k-1"))
            replayed = await client.post("/orders", json=CART, headers=_headers("k-1"))
        await _check_one_of_each(shop, resumed)
        assert replayed.headers["idempotent-replayed"] == "true"
        assert replayed.json() == resumed.json()
        # The charge step was replayed from the record: the provider was asked once.
        assert list((await shop.provider_requests()).values()) == [1]


# (fault, what the dead process left: order rows, recorded steps; requests the provider got)
_DEATHS = {
    # Inside the transactional step: its INSERT dies uncommitted with its recovery point.
    "die-in-order": (0, None, 1),
    # After the provider charged: the retry charges again with the same key.
    "die-in-charge": (1, 1, 2),
}


@pytest.mark.parametrize("fault", sorted(_DEATHS))
async def test_a_shop_process_dying_in_a_step_resumes_on_another_with_one_of_each(
    fault: str, postgres_server: PostgresServer
) -> None:
    orders_left, steps_left, provider_requests = _DEATHS[fault]
    async with (
        deployment(postgres_server) as shop,
        running(EXAMPLE, shop.env) as dying,
        running(EXAMPLE, shop.env) as other,
    ):
        async with httpx.AsyncClient(timeout=60, limits=_FRESH) as client:
            with pytest.raises(httpx.TransportError):  # the connection drops with the process
                await client.post(
                    f"{dying}/orders", json=CART, headers=_headers("k-2", **{"X-Demo-Fault": fault})
                )
            died = time.monotonic()
            orders, outbox, records = await shop.rows()
            assert len(orders) == orders_left and outbox == []
            assert [(row["status"], row["step_count"]) for row in records] == [
                ("INPROGRESS", steps_left)
            ]
            # The client's retry reaches the other instance: it waits for the dead
            # process's lease to end, takes the key over keeping the recorded steps, and
            # runs the step that died again (the charge with the same downstream key).
            resumed = await client.post(f"{other}/orders", json=CART, headers=_headers("k-2"))
        assert time.monotonic() - died < LEASE + 15
        await _check_one_of_each(shop, resumed)
        (requests,) = (await shop.provider_requests()).values()
        assert requests == provider_requests  # one key at the provider: one charge


async def test_a_client_that_gives_up_mid_request_then_retries_gets_one_of_each(
    postgres_server: PostgresServer,
) -> None:
    """The client cuts the connection during the charge: the request goes on without it
    (nothing after the charge is undone), and the retry gets its answer."""
    async with deployment(postgres_server) as shop, running(EXAMPLE, shop.env) as url:
        slow = {**CART, "slow": 1.5}
        async with httpx.AsyncClient(base_url=url, timeout=0.5) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await impatient.post("/orders", json=slow, headers=_headers("k-4"))
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=_FRESH) as client:
            retried = await client.post("/orders", json=slow, headers=_headers("k-4"))
        await _check_one_of_each(shop, retried)
        assert list((await shop.provider_requests()).values()) == [1]


async def test_concurrent_duplicates_run_each_step_once_and_another_body_is_422(
    postgres_server: PostgresServer,
) -> None:
    async with (
        deployment(postgres_server) as shop,
        running(EXAMPLE, shop.env) as first,
        running(EXAMPLE, shop.env) as second,
    ):
        slow = {**CART, "slow": 0.5}
        async with httpx.AsyncClient(timeout=60, limits=_FRESH) as client:
            answers = await asyncio.gather(
                *(
                    client.post(f"{url}/orders", json=slow, headers=_headers("k-3"))
                    for url in [first, second] * 3
                )
            )
            other_body = await client.post(
                f"{first}/orders", json={**slow, "qty": 3}, headers=_headers("k-3")
            )
        assert [answer.status_code for answer in answers] == [201] * 6
        replayed = [answer.headers.get("idempotent-replayed") == "true" for answer in answers]
        assert replayed.count(False) == 1
        assert len({answer.content for answer in answers}) == 1
        await _check_one_of_each(shop, answers[0])
        assert list((await shop.provider_requests()).values()) == [1]
        assert other_body.status_code == 422
        assert other_body.headers["content-type"] == "application/problem+json"
