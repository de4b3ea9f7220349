"""The quickstart flow on DynamoDB: a local moto server, or real AWS.

    python examples/dynamodb_local.py                  # starts a local moto server
    IDEMPOTENCY_TABLE=my-table python examples/dynamodb_local.py --aws

Locally it starts ``moto`` (installed by the ``dev`` extra) on a free 127.0.0.1 port,
single-threaded (its threaded mode does not make conditional writes atomic), creates
the table and runs the calls.  With ``--aws`` it uses your normal AWS configuration
(environment, profile or role) and an existing table named by ``IDEMPOTENCY_TABLE``;
create one with the snippets in docs/dynamodb.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import aioboto3

from idempotency_async import Manager, Options, errors
from idempotency_async.stores.dynamodb import DynamoDBStore, create_table

_MOTO = (
    "import sys; from werkzeug.serving import run_simple; "
    "from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app; "
    "run_simple('127.0.0.1', int(sys.argv[1]), DomainDispatcherApplication(create_backend_app), "
    "threaded=False)"
)


@contextlib.contextmanager
def local_moto() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-c", _MOTO, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


async def charge(order: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0.05)
    print(f"    -> payment API called for {order['id']}")
    return {"order": order["id"], "charged": order["amount"]}


async def run(session: aioboto3.Session, table: str, endpoint: str | None) -> None:
    async with session.client("dynamodb", endpoint_url=endpoint) as client:
        if endpoint is not None:
            await create_table(client, table)
        store = DynamoDBStore(client, table_name=table)
        options = Options(
            key_prefix="example", event_key_jmespath="id", payload_validation_jmespath="amount"
        )
        manager = Manager(store, options)
        order = {"id": f"ord-{uuid.uuid4().hex[:8]}", "amount": 42}
        print("first call:", await manager.execute(order, lambda: charge(order), timeout=5))
        print("replay:    ", await manager.execute(order, lambda: charge(order), timeout=5))
        try:
            changed = {"id": order["id"], "amount": 1}
            await manager.execute(changed, lambda: charge(changed), timeout=5)
        except errors.PayloadValidationError:
            print("changed amount: PayloadValidationError")
        second = Manager(store, options)  # another "process" sharing the table
        print(
            "other process replays:", await second.execute(order, lambda: charge(order), timeout=5)
        )


def main() -> None:
    if "--aws" in sys.argv:
        asyncio.run(run(aioboto3.Session(), os.environ["IDEMPOTENCY_TABLE"], None))
        return
    dummy = aioboto3.Session(
        aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
    )
    with local_moto() as endpoint:
        asyncio.run(run(dummy, "idempotency-example", endpoint))


if __name__ == "__main__":
    main()
