"""Every guide opens with its code and a table, and that code runs as the page shows.

A reader skims a guide from the top: a short program, then a table of options, outcomes
or choices, then the prose (``docs/choose.md`` set the shape).  The opening programs run
here as written — in this process, on the real servers the pages use (moto, redis-server,
postgres) — and print the output blocks beside them.  The getting-started programs run in
``tests/test_docs_examples.py``.
"""

from __future__ import annotations

import asyncio
import json
import re
import runpy
import shlex
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from _moto import REGION, open_client

from idempotency_async.stores.dynamodb import create_table

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

GUIDES = [
    "start/asyncio.md",
    "start/lambda.md",
    "start/fastapi.md",
    "start/aiohttp.md",
    "start/dynamodb.md",
    "choose.md",
    "manager.md",
    "lambda.md",
    "http.md",
    "agents.md",
    "downstream.md",
    "steps.md",
    "dynamodb.md",
    "redis.md",
    "postgres.md",
    "stores.md",
    "cli.md",
    "observability.md",
    "migrate-from-powertools.md",
    "testing-your-handler.md",
]

_FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```$", re.S | re.M)


def _opening(page: str) -> str:
    """The page from its title to its first section."""
    text = (DOCS / page).read_text()
    title, _, body = text.partition("\n")
    assert title.startswith("# "), f"{page} does not start with its title"
    return body.split("\n## ", 1)[0]


def _blocks(page: str) -> list[tuple[str, str, str]]:
    """The opening's fenced blocks: (language, info, code)."""
    return [match.groups() for match in _FENCE.finditer(_opening(page))]


def _program(page: str) -> str:
    language, _, code = _blocks(page)[0]
    assert language == "python", f"{page} opens with a {language!r} block"
    return code


def _output(page: str) -> str:
    outputs = [code for _, info, code in _blocks(page) if 'title="output"' in info]
    assert len(outputs) == 1, f"{page} has no output block in its opening"
    return outputs[0]


def _run(page: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Run the page's opening program as a module named ``app``; what it defined."""
    path = tmp_path / f"{uuid.uuid4().hex}.py"
    path.write_text(_program(page))
    capsys.readouterr()
    return runpy.run_path(str(path), run_name="app")


@pytest.mark.parametrize("page", GUIDES)
def test_every_guide_opens_with_its_code_and_a_table(page: str) -> None:
    opening = _opening(page).strip()
    assert opening.startswith("```"), f"{page}: the code comes first, right after the title"
    table = re.search(r"^\|.*\|\n\|[ :-]+\|", opening, re.M)
    assert table is not None, f"{page}: no table before its first section"
    code_end = _FENCE.search(opening)
    assert code_end is not None and code_end.end() < table.start()


@pytest.mark.parametrize(
    "page",
    ["manager.md", "downstream.md", "steps.md", "stores.md", "observability.md", "agents.md"],
)
def test_in_process_openings_print_their_output(
    page: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(page, tmp_path, capsys)
    assert capsys.readouterr().out == _output(page)


async def test_http_opening_app_replays_and_refuses_as_its_table_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = _run("http.md", tmp_path, capsys)["app"]
    headers = {"Idempotency-Key": "k-1", "X-API-Key": "alice"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://docs") as client:
        first = await client.post("/orders", headers=headers, json={"sku": "A1"})
        again = await client.post("/orders", headers=headers, json={"sku": "A1"})
        changed = await client.post("/orders", headers=headers, json={"sku": "B2"})
        keyless = await client.post("/orders", headers={"X-API-Key": "alice"}, json={})
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() == {"id": "ord_1", "sku": "A1"}
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert (changed.status_code, keyless.status_code) == (422, 400)


class _Context:
    def get_remaining_time_in_millis(self) -> int:
        return 10_000


def _local_aws(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> str:
    table = f"docs-{uuid.uuid4().hex[:10]}"
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "IDEMPOTENCY_TABLE": table,
    }.items():
        monkeypatch.setenv(name, value)

    async def create() -> None:
        async with open_client(endpoint) as client:
            await create_table(client, table)

    asyncio.run(create())
    return table


def _items(endpoint: str, table: str) -> list[dict[str, Any]]:
    async def scan() -> list[dict[str, Any]]:
        async with open_client(endpoint) as client:
            items: list[dict[str, Any]] = (await client.scan(TableName=table))["Items"]
            return items

    return asyncio.run(scan())


@pytest.mark.dynamodb
@pytest.mark.parametrize("page", ["lambda.md", "migrate-from-powertools.md"])
def test_lambda_openings_replay_the_second_invocation(
    page: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    moto_endpoint: str,
) -> None:
    table = _local_aws(monkeypatch, moto_endpoint)
    handler = _run(page, tmp_path, capsys)["handler"]
    event = {"body": json.dumps({"order_id": "o-1"}), "headers": {}}
    try:
        first, second = handler(event, _Context()), handler(event, _Context())
    finally:
        handler.close()
    assert first == second and first["statusCode"] == 201
    (item,) = _items(moto_endpoint, table)  # one record: the second invocation replayed it
    assert item["status"] == {"S": "COMPLETED"}


@pytest.mark.dynamodb
def test_dynamodb_opening_runs_on_a_table(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    moto_endpoint: str,
) -> None:
    table = _local_aws(monkeypatch, moto_endpoint)
    for _ in range(2):  # the second time as another process would: a replay
        _run("dynamodb.md", tmp_path, capsys)
        assert capsys.readouterr().out == "charged\n"
    assert len(_items(moto_endpoint, table)) == 1


@pytest.mark.redis
def test_redis_opening_runs_on_a_server(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    redis_server: Any,
) -> None:
    # A database of its own: the program's key prefix is fixed.
    monkeypatch.setenv("REDIS_URL", f"{redis_server.url}/7")
    _run("redis.md", tmp_path, capsys)
    assert capsys.readouterr().out == "charged\n"

    async def keys() -> list[bytes]:
        client = redis_server.client(db=7)
        try:
            found: list[bytes] = await client.keys("*")
            await client.flushdb()
            return found
        finally:
            await client.aclose()

    assert len(asyncio.run(keys())) == 1


@pytest.mark.postgres
def test_postgres_opening_runs_on_a_database(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    postgres_server: Any,
) -> None:
    database = f"docs_{uuid.uuid4().hex[:12]}"  # the program uses the default table

    async def create() -> None:
        admin = await postgres_server.connect()
        try:
            await admin.execute(f"CREATE DATABASE {database}")
        finally:
            await admin.close()

    asyncio.run(create())
    dsn = postgres_server.dsn.rsplit("/", 1)[0] + f"/{database}"
    monkeypatch.setenv("DATABASE_URL", dsn)
    for _ in range(2):  # again: create_table finds its table, and the call replays
        _run("postgres.md", tmp_path, capsys)
        assert capsys.readouterr().out == "charged\n"

    async def statuses() -> list[str]:
        connection = await postgres_server.connect(database=database)
        try:
            return [
                row[0] for row in await connection.fetch("SELECT status FROM idempotency_records")
            ]
        finally:
            await connection.close()

    assert asyncio.run(statuses()) == ["COMPLETED"]


def test_cli_opening_commands_are_the_tools_own(capsys: pytest.CaptureFixture[str]) -> None:
    from idempotency_async.cli._parser import build_parser

    language, _, script = _blocks("cli.md")[0]
    assert language == "bash"
    commands = [
        shlex.split(line, comments=True)
        for line in script.splitlines()
        if line.startswith("idempotency-async ")
    ]
    assert len(commands) >= 5
    for command in commands:
        build_parser().parse_args(command[1:])  # a wrong option exits with a usage error
