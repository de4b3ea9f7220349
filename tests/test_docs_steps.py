"""docs/steps.md: every Python block on the page runs as the page says.

The opening program (``checkout.py``) runs with the other guides' openings in
``tests/test_docs_guides.py``; the others run here, in this process: ``call_step.py`` and
``mismatch.py`` print their output blocks, ``app.py`` is served through httpx's ASGI
transport, and ``transactional_step.py`` prints its output on the Postgres fixture, in a
database of its own.  A Python block without a test here fails ``test_every_python_block_is_run``.
The CLI block is what ``get`` prints for the record a real failed call leaves.
"""

from __future__ import annotations

import asyncio
import re
import runpy
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "steps.md"
_FENCE = re.compile(r'^```(\w*)(?: title="([^"]*)")?\n(.*?)^```$', re.S | re.M)

RUN_HERE = {"call_step.py", "mismatch.py", "app.py", "transactional_step.py"}
RUN_WITH_THE_GUIDES = {"checkout.py"}


def _blocks() -> dict[str, tuple[str, str]]:
    """Titled blocks: title -> (language, code)."""
    return {title: (language, code) for language, title, code in _FENCE.findall(PAGE.read_text())}


def _run(title: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    path = tmp_path / f"{uuid.uuid4().hex}.py"
    path.write_text(_blocks()[title][1])
    capsys.readouterr()
    return runpy.run_path(str(path), run_name="docs_steps")


def test_every_python_block_is_run() -> None:
    python = [
        (title, code)
        for language, title, code in _FENCE.findall(PAGE.read_text())
        if language == "python"
    ]
    assert all(title for title, _ in python), "every Python block on steps.md needs a title"
    assert {title for title, _ in python} == RUN_HERE | RUN_WITH_THE_GUIDES


@pytest.mark.parametrize("title", ["call_step.py", "mismatch.py"])
def test_program_prints_its_output(
    title: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(title, tmp_path, capsys)
    assert capsys.readouterr().out == _blocks()[f"{title} output"][1]


@pytest.mark.postgres
def test_the_transactional_step_commits_its_row_with_its_recovery_point(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    postgres_server: Any,
) -> None:
    database = f"docs_{uuid.uuid4().hex[:12]}"  # the program uses the default tables

    async def sql(statement: str, **options: Any) -> Any:
        connection = await postgres_server.connect(**options)
        try:
            return await connection.fetch(statement)
        finally:
            await connection.close()

    asyncio.run(sql(f"CREATE DATABASE {database}"))
    monkeypatch.setenv("DATABASE_URL", postgres_server.dsn.rsplit("/", 1)[0] + f"/{database}")
    _run("transactional_step.py", tmp_path, capsys)
    assert capsys.readouterr().out == _blocks()["transactional_step.py output"][1]
    records = asyncio.run(sql("SELECT status, steps FROM idempotency_records", database=database))
    assert [(row["status"], row["steps"]) for row in records] == [("COMPLETED", None)]


async def test_the_http_app_resumes_after_a_500_without_a_second_charge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = _run("app.py", tmp_path, capsys)
    app, charges, mail = program["app"], program["charges"], program["mail"]
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    headers = {"Idempotency-Key": "k-1", "X-API-Key": "alice"}
    async with httpx.AsyncClient(transport=transport, base_url="http://docs") as client:
        failed = await client.post("/orders", headers=headers, json={"amount": 42})
        mail["down"] = False
        resumed = await client.post("/orders", headers=headers, json={"amount": 42})
        replayed = await client.post("/orders", headers=headers, json={"amount": 42})

    assert failed.status_code == 500
    assert resumed.status_code == 201 and resumed.json() == {"charge": "ch_1"}
    assert replayed.json() == {"charge": "ch_1"}
    assert replayed.headers["idempotent-replayed"] == "true"
    assert len(charges) == 1  # the retry replayed the charge step


async def test_the_cli_block_is_what_get_prints_for_a_released_record() -> None:
    """The "Operators: the CLI" block, but for its expiry line (a time of day)."""
    import time

    from test_cli_steps import _failed_after_two_steps

    from idempotency_async import MemoryStore
    from idempotency_async.cli._render import record_lines

    _, _, record = await _failed_after_two_steps(MemoryStore())
    text = PAGE.read_text()
    block = text[text.index("```text\nkey ") + len("```text\n") :].split("```", 1)[0]
    printed = record_lines(record, time.time())
    shown = block.splitlines()
    assert len(printed) == len(shown)
    for line, documented in zip(printed, shown, strict=True):
        if not line.startswith("expires"):
            assert line == documented
