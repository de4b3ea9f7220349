"""The getting-started pages' programs run, and print what the pages say they print.

Each page under ``docs/start/`` holds its program in a code block with a title
(```` ```python title="app.py" ````); these tests write the blocks to files and run them
against this checkout, with real servers where the page uses one (moto for DynamoDB, the
ASGI app through httpx, the aiohttp app through its test server).  Guides' programs
titled the same way run too (docs/postgres.md's transactional call, on the Postgres
fixture in a database of its own).
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer

ROOT = Path(__file__).parents[1]
START = ROOT / "docs" / "start"


def block(page: str, title: str) -> str:
    """The code block titled ``title`` on ``docs/start/<page>.md``."""
    return guide_block(f"start/{page}", title)


def guide_block(page: str, title: str) -> str:
    """The code block titled ``title`` on ``docs/<page>.md``."""
    text = (ROOT / "docs" / f"{page}.md").read_text()
    match = re.search(rf'^```\w+ title="{re.escape(title)}"\n(.*?)^```$', text, re.S | re.M)
    assert match is not None, f"docs/{page}.md has no block titled {title!r}"
    return match.group(1)


def write_blocks(page: str, directory: Path, *titles: str) -> None:
    for title in titles:
        (directory / title).write_text(block(page, title))


def run_python(args: list[str], cwd: Path, **env: str) -> str:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    completed = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout


def local_aws(endpoint: str, table: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "IDEMPOTENCY_TABLE": table,
    }


def test_asyncio_page_program_prints_its_documented_output(tmp_path: Path) -> None:
    write_blocks("asyncio", tmp_path, "orders.py")
    assert run_python(["orders.py"], tmp_path) == block("asyncio", "output")


@pytest.mark.dynamodb
def test_dynamodb_page_program_runs_once_against_moto(tmp_path: Path, moto_endpoint: str) -> None:
    write_blocks("dynamodb", tmp_path, "orders_dynamodb.py")
    env = local_aws(moto_endpoint, f"docs-{uuid.uuid4().hex[:8]}")
    assert run_python(["orders_dynamodb.py"], tmp_path, **env) == block("dynamodb", "output")
    # A second run finds the completed record: the payment API is not called again.
    assert "payment API called" not in run_python(["orders_dynamodb.py"], tmp_path, **env)


@pytest.mark.dynamodb
def test_lambda_page_handler_replays_the_second_invocation(
    tmp_path: Path, moto_endpoint: str
) -> None:
    write_blocks("lambda", tmp_path, "app.py", "invoke.py")
    env = local_aws(moto_endpoint, "idempotency")  # the table the page's setup command creates
    setup = re.search(r'python -c "(.*?)"\n', lambda_setup_commands(), re.S)
    assert setup is not None
    run_python(["-c", setup.group(1)], tmp_path, **env)
    assert run_python(["invoke.py"], tmp_path, **env) == block("lambda", "output")


def lambda_setup_commands() -> str:
    text = (START / "lambda.md").read_text()
    match = re.search(r"```bash\nexport AWS_ENDPOINT_URL.*?```", text, re.S)
    assert match is not None
    return match.group(0)


def load_app(page: str, tmp_path: Path) -> dict[str, Any]:
    write_blocks(page, tmp_path, "app.py")
    return runpy.run_path(str(tmp_path / "app.py"), run_name="docs_app")


async def test_fastapi_page_app_replays_a_retried_request(tmp_path: Path) -> None:
    app = load_app("fastapi", tmp_path)["app"]
    transport = httpx.ASGITransport(app=app)
    headers = {"Idempotency-Key": "k-1", "X-API-Key": "alice"}
    async with httpx.AsyncClient(transport=transport, base_url="http://docs") as client:
        first = await client.post("/orders", headers=headers, json={"sku": "A1", "qty": 2})
        again = await client.post(
            "/orders",
            headers={**headers, "Content-Type": "application/json"},
            content=b'{"qty": 2, "sku": "A1"}',  # the page's retry: members reordered
        )
        changed = await client.post("/orders", headers=headers, json={"sku": "A1", "qty": 3})
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() == {"id": "ord_0001", "sku": "A1", "qty": 2}
    assert again.headers["idempotent-replayed"] == "true"
    assert changed.status_code == 422


async def test_aiohttp_page_app_replays_a_retried_request(tmp_path: Path) -> None:
    make_app = load_app("aiohttp", tmp_path)["make_app"]
    headers = {"Idempotency-Key": "k-1", "X-API-Key": "alice"}
    async with TestClient(TestServer(make_app())) as client:
        first = await client.post("/orders", headers=headers, json={"sku": "A1"})
        again = await client.post("/orders", headers=headers, json={"sku": "A1"})
        assert first.status == again.status == 201
        assert await first.json() == await again.json() == {"id": "ord_0001", "sku": "A1"}
        assert again.headers["idempotent-replayed"] == "true"


@pytest.mark.postgres
async def test_postgres_page_transactional_program_pays_once(
    tmp_path: Path, postgres_server: Any
) -> None:
    """docs/postgres.md, "Transactional calls": the payment and the record commit together;
    the retry, and a second run of the program, replay without a second payment."""
    database = f"docs_{uuid.uuid4().hex[:12]}"
    admin = await postgres_server.connect()
    try:
        await admin.execute(f"CREATE DATABASE {database}")
    finally:
        await admin.close()
    (tmp_path / "payments.py").write_text(guide_block("postgres", "payments.py"))
    dsn = postgres_server.dsn.rsplit("/", 1)[0] + f"/{database}"
    assert run_python(["payments.py"], tmp_path, DATABASE_URL=dsn) == guide_block(
        "postgres", "output"
    )
    again = run_python(["payments.py"], tmp_path, DATABASE_URL=dsn)
    assert "payment recorded" not in again
    assert again.count("'status': 'paid'") == 2
    connection = await postgres_server.connect(database=database)
    try:
        assert await connection.fetchval("SELECT count(*) FROM payments") == 1
    finally:
        await connection.close()
