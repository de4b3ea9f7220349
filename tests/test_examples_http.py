"""The HTTP examples, run as real servers (memory and DynamoDB), answer as docs/http.md shows."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from _moto import fresh_table, new_session, open_client
from support import checkout_env

ROOT = Path(__file__).parents[1]
EXAMPLES = ["fastapi_app.py", "aiohttp_app.py"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# A cold start of an example (imports of FastAPI, aioboto3...) takes about 0.5 s here and
# several seconds on a slow, loaded machine; the budget only bounds a hang.
_STARTUP_SECONDS = 60.0
_PORT_ATTEMPTS = 3


async def _serving(url: str, process: asyncio.subprocess.Process) -> bool:
    """Whether the server answers at ``url`` before it exits (or the budget runs out)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _STARTUP_SECONDS
    async with httpx.AsyncClient() as probe:
        while loop.time() < deadline and process.returncode is None:
            try:
                await probe.get(url + "/")
                return True
            except httpx.TransportError:
                await asyncio.sleep(0.05)
    return False


@asynccontextmanager
async def running(example: str, env: dict[str, str]) -> AsyncIterator[str]:
    for attempt in range(1, _PORT_ATTEMPTS + 1):
        port = _free_port()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ROOT / "examples" / example),
            env=checkout_env(**env, PORT=str(port)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            if await _serving(url, process):
                yield url
                return
        finally:
            if process.returncode is None:
                process.terminate()
            await process.wait()
        assert process.stdout is not None
        output = (await process.stdout.read()).decode(errors="replace")
        # The port was free when probed, but the server binds it only after its imports:
        # another socket can take it in between.  Then start again on another port.
        if "address already in use" in output.lower() and attempt < _PORT_ATTEMPTS:
            continue
        raise AssertionError(
            f"{example} did not serve within {_STARTUP_SECONDS:.0f} s "
            f"(exit code {process.returncode}):\n{output[-3000:]}"
        )


async def _exercise(url: str) -> None:
    headers = {"Idempotency-Key": "order-1", "X-API-Key": "alice"}
    async with httpx.AsyncClient(base_url=url) as client:
        first = await client.post("/orders", json={"sku": "A1", "qty": 2}, headers=headers)
        assert first.status_code == 201, first.text
        assert "idempotent-replayed" not in first.headers
        replay = await client.post("/orders", json={"sku": "A1", "qty": 2}, headers=headers)
        assert replay.status_code == 201
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.json() == first.json()
        assert replay.headers["location"] == first.headers["location"]
        changed = await client.post("/orders", json={"sku": "B2", "qty": 1}, headers=headers)
        assert changed.status_code == 422
        assert changed.headers["content-type"] == "application/problem+json"
        other_tenant = await client.post(
            "/orders", json={"sku": "A1", "qty": 2}, headers={**headers, "X-API-Key": "bob"}
        )
        assert other_tenant.status_code == 201
        assert other_tenant.json()["id"] != first.json()["id"]
        missing = await client.post("/orders", json={"sku": "A1", "qty": 2})
        assert missing.status_code == 400


@pytest.mark.parametrize("example", EXAMPLES)
async def test_example_replays_on_memory_store(example: str) -> None:
    async with running(example, {}) as url:
        await _exercise(url)


@pytest.mark.parametrize("example", EXAMPLES)
async def test_example_replays_on_dynamodb(
    example: str, moto_endpoint: str, dynamodb_client: Any
) -> None:
    table = await fresh_table(dynamodb_client)
    env = {
        "IDEMPOTENCY_DYNAMODB_TABLE": table,
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    async with running(example, env) as url:
        await _exercise(url)
    scan = await dynamodb_client.scan(TableName=table)
    statuses = sorted(item["status"]["S"] for item in scan["Items"])
    assert statuses == ["COMPLETED", "COMPLETED"]  # alice's and bob's records


__all__ = ["new_session", "open_client"]
