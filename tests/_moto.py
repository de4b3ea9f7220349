"""Pytest fixtures for DynamoDB tests: a real moto server over HTTP, no in-process mocks.

The server runs single-threaded in a subprocess: moto's threaded server does not make a
conditional write atomic (see docs/dynamodb.md, "Running DynamoDB locally"), so a correct
store would look broken under concurrency.  Import the fixtures with ``from _moto import *``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import aioboto3
import pytest
from aiobotocore.config import AioConfig

from idempotency_async.stores.dynamodb import DynamoDBStore, create_table
from idempotency_async.stores.dynamodb_light import LightDynamoDBClient

__all__ = [
    "REGION",
    "TRANSPORTS",
    "dynamodb_client",
    "fresh_store",
    "fresh_table",
    "moto_endpoint",
    "new_session",
    "open_client",
    "open_light_client",
    "open_transport",
    "store_client",
    "transport",
]

TRANSPORTS = ["aioboto3", "light"]
"""The DynamoDB transports every store and manager suite runs on."""

REGION = "us-east-1"
_STARTUP_SECONDS = 30.0
# The server binds a port of its own choosing and reports it through a file: a port picked
# by the parent and bound later by the child could be taken in between.
_SERVER_SCRIPT = """
import os, sys
from werkzeug.serving import make_server
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

server = make_server(sys.argv[1], 0, DomainDispatcherApplication(create_backend_app))
with open(sys.argv[2] + ".part", "w") as report:
    report.write(str(server.port))
os.replace(sys.argv[2] + ".part", sys.argv[2])
server.serve_forever()
"""


@functools.cache
def new_session() -> aioboto3.Session:
    """A session with dummy credentials, so no test reads the machine's AWS configuration.

    One for the whole run: a session loads and caches botocore's service models, which
    costs about 0.13 s of CPU per client when every client has a session of its own.  Its
    credentials are static, so nothing in it is bound to an event loop."""
    return aioboto3.Session(
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        aws_session_token="testing",
        region_name=REGION,
    )


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """URL of a single-threaded moto server started for this test session."""
    with tempfile.TemporaryFile() as log, tempfile.TemporaryDirectory() as directory:
        port_file = os.path.join(directory, "port")
        process = subprocess.Popen(
            [sys.executable, "-c", _SERVER_SCRIPT, "127.0.0.1", port_file],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            url, problem = _wait_until_answering(port_file, process)
            if problem is not None:
                log.seek(0)
                _give_up(f"{problem}\n--- server output ---\n{log.read()[-4000:].decode()}")
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def open_client(endpoint: str) -> Any:
    """An async context manager yielding an aioboto3 DynamoDB client for ``endpoint``."""
    config = AioConfig(
        retries={"mode": "standard", "total_max_attempts": 2},
        connect_timeout=5,
        read_timeout=30,
    )
    return new_session().client("dynamodb", endpoint_url=endpoint, config=config)


def open_light_client(endpoint: str, **options: Any) -> LightDynamoDBClient:
    """The light transport for ``endpoint``, with the same dummy credentials."""
    settings: dict[str, Any] = {"max_attempts": 2, "connect_timeout": 5, "read_timeout": 30}
    return LightDynamoDBClient(
        region=REGION,
        endpoint_url=endpoint,
        access_key_id="testing",
        secret_access_key="testing",
        session_token="testing",
        **{**settings, **options},
    )


def open_transport(
    transport: str, endpoint: str, *, fast_fail: bool = False
) -> AbstractAsyncContextManager[Any]:
    """A client of ``transport`` for ``endpoint``; ``fast_fail``: one attempt, short timeouts."""
    if transport == "light":
        fast = {"max_attempts": 1, "connect_timeout": 1, "read_timeout": 0.5}
        return open_light_client(endpoint, **(fast if fast_fail else {}))
    if not fast_fail:
        return open_client(endpoint)
    config = AioConfig(
        retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=1, read_timeout=0.5
    )
    return new_session().client("dynamodb", endpoint_url=endpoint, config=config)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Each DynamoDB transport in turn."""
    name: str = request.param
    return name


@pytest.fixture
async def store_client(
    transport: str, dynamodb_client: Any, moto_endpoint: str
) -> AsyncIterator[Any]:
    """The client the store under test uses: aioboto3's, or the light transport.

    Tests keep ``dynamodb_client`` (aioboto3) for setup and for reading items raw, so what
    one transport wrote is checked by the other."""
    if transport == "aioboto3":
        yield dynamodb_client
        return
    async with open_light_client(moto_endpoint) as client:
        yield client


@pytest.fixture
async def dynamodb_client(moto_endpoint: str) -> AsyncIterator[Any]:
    """An aioboto3 DynamoDB client against the moto server, closed after the test."""
    async with open_client(moto_endpoint) as client:
        yield client


async def fresh_table(client: Any, *, sort_key: bool = False, **attributes: Any) -> str:
    """Create a uniquely named idempotency table and return its name."""
    name = f"idem-{uuid.uuid4().hex[:12]}"
    await create_table(client, name, sort_key=sort_key, **attributes)
    return name


async def fresh_store(client: Any, *, store_client: Any = None, **kwargs: Any) -> DynamoDBStore:
    """A store on a new table whose key schema matches the store's options.

    ``client`` (aioboto3) creates the table; the store uses ``store_client`` if given."""
    table_options = {
        option: kwargs[option] for option in ("key_attr", "expiry_attr") if option in kwargs
    }
    sort_key_attr = kwargs.get("sort_key_attr")
    if sort_key_attr is not None:
        table_options["sort_key_attr"] = sort_key_attr
    name = await fresh_table(client, sort_key=sort_key_attr is not None, **table_options)
    return DynamoDBStore(store_client or client, table_name=name, **kwargs)


def _wait_until_answering(
    port_file: str, process: subprocess.Popen[bytes]
) -> tuple[str, str | None]:
    """The server's URL, and why it is not serving (``None``: it is)."""
    deadline = time.monotonic() + _STARTUP_SECONDS
    url = ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return url, f"the moto server exited with code {process.returncode}"
        if not url and os.path.exists(port_file):
            with open(port_file) as report:
                url = f"http://127.0.0.1:{int(report.read())}"
        if url:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                    return url, None
            except urllib.error.HTTPError:
                return url, None  # any HTTP answer means it is serving
            except OSError:
                pass
        time.sleep(0.05)
    return url, f"the moto server did not answer within {_STARTUP_SECONDS:.0f} s"


def _give_up(reason: str) -> None:
    message = f"cannot start the moto server for DynamoDB tests: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(f"!!! SKIPPED, NOT PASSED: {message}")
