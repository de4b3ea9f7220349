"""Each row of docs/choose.md ("Choose your guarantee") is a test: a worker process
dies right after its callback's effect (``tests/_choose_worker.py``), then a retry of
the same key shows what the row promises — on a real PostgreSQL server, with a real
provider on loopback for downstream keys.  ``test_every_row_names_its_test`` keeps the
page and this file together.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _choose_worker import LEASE, TIMEOUT, effect, manager
from _http_apps import serve_aio
from _postgres import PostgresServer, fresh_table_name
from aiohttp import web

from idempotency_async import errors
from idempotency_async.stores.postgres import PostgresStore, create_table

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "choose.md"


class Provider:
    """A payments provider that honours Idempotency-Key: one charge per key."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.charges: dict[str, str] = {}
        self.app = web.Application()
        self.app.router.add_post("/charges", self.charge)

    async def charge(self, request: web.Request) -> web.Response:
        key = request.headers["Idempotency-Key"]
        self.requests[key] += 1
        charge = self.charges.setdefault(key, f"ch_{len(self.charges) + 1}")
        return web.json_response({"charge": charge})


class Row:
    def __init__(self, server: PostgresServer, provider: str) -> None:
        self.dsn = server.dsn
        self.records, self.effects = fresh_table_name(), fresh_table_name()
        self.provider = provider

    async def setup(self, connection: Any) -> None:
        await create_table(connection, table=self.records)
        await connection.execute(f"CREATE TABLE {self.effects} (key text, pid int)")

    async def crash(self, mode: str, key: str) -> None:
        """Run a worker that dies right after its effect."""
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ROOT / "tests" / "_choose_worker.py"),
            mode,
            self.dsn,
            self.records,
            self.effects,
            key,
            self.provider,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])},
        )
        out, err = await asyncio.wait_for(worker.communicate(), timeout=60)
        assert (worker.returncode, out) == (17, b"effect\n"), err.decode()

    async def retry(self, mode: str, key: str, *, within: float) -> tuple[Any, float]:
        """Retry the key until it runs or replays; (the result, seconds it was refused)."""
        import asyncpg

        started = time.monotonic()
        connection = await asyncpg.connect(self.dsn)
        try:
            async with PostgresStore.from_url(self.dsn, table=self.records) as store:
                again = manager(store, mode)
                while True:
                    try:
                        if mode == "transactional":
                            async with connection.transaction():
                                result = await again.execute_in_transaction(
                                    connection,
                                    {"id": key},
                                    lambda: effect(
                                        mode, self.effects, key, connection, self.provider
                                    ),
                                    timeout=TIMEOUT[mode],
                                )
                        else:
                            result = await again.execute(
                                {"id": key},
                                lambda: effect(mode, self.effects, key, connection, self.provider),
                                timeout=TIMEOUT[mode],
                            )
                        return result, time.monotonic() - started
                    except errors.AlreadyInProgressError:
                        assert time.monotonic() - started < within, "the key stayed blocked"
                        await asyncio.sleep(0.05)
        finally:
            await connection.close()

    async def committed(self, connection: Any, key: str) -> int:
        found: int = await connection.fetchval(
            f"SELECT count(*) FROM {self.effects} WHERE key = $1", key
        )
        return found


@pytest.fixture
async def row(postgres_server: PostgresServer) -> AsyncIterator[tuple[Row, Provider, Any]]:
    import asyncpg

    provider = Provider()
    async with serve_aio(provider.app) as url:
        found = Row(postgres_server, url)
        connection = await asyncpg.connect(postgres_server.dsn)
        try:
            await found.setup(connection)
            yield found, provider, connection
        finally:
            await connection.close()


pytestmark = pytest.mark.postgres


async def test_lease_mode_runs_again_after_a_crash_once_the_lease_ends(
    row: tuple[Row, Provider, Any],
) -> None:
    found, _, connection = row
    await found.crash("lease", "k")
    # The key stays in progress until the lease (the call's 2 s deadline) ends...
    _, refused = await found.retry("lease", "k", within=10)
    # ...then the retry runs the callback again: the committed effect happened twice.
    assert await found.committed(connection, "k") == 2
    assert refused > 0.3  # it was blocked, not free at once (a generous bound)


async def test_renewal_frees_a_crashed_key_after_one_short_lease(
    row: tuple[Row, Provider, Any],
) -> None:
    found, _, connection = row
    await found.crash("renewal", "k")
    # The call's deadline is 60 s; the renewed lease is 2 s: the key is free within a
    # few seconds of the crash (generous: 15 s), and the callback runs again.
    _, refused = await found.retry("renewal", "k", within=15)
    assert refused < 15 < TIMEOUT["renewal"]
    assert await found.committed(connection, "k") == 2


async def test_transactional_mode_commits_exactly_one_effect(
    row: tuple[Row, Provider, Any],
) -> None:
    found, _, connection = row
    await found.crash("transactional", "k")
    # The dead worker's transaction rolled back with its effect and its claim: the key is
    # free at once, the retry runs, and one effect is committed.
    _, refused = await found.retry("transactional", "k", within=10)
    assert refused < 5  # not blocked until a lease: the transaction died with its process
    assert await found.committed(connection, "k") == 1
    # A duplicate after the commit replays and writes nothing.
    await found.retry("transactional", "k", within=10)
    assert await found.committed(connection, "k") == 1


async def test_downstream_keys_give_the_provider_one_key(row: tuple[Row, Provider, Any]) -> None:
    found, provider, _ = row
    await found.crash("downstream", "k")
    result, _ = await found.retry("downstream", "k", within=10)
    # The callback ran twice (lease mode), and sent the same key both times: the provider
    # saw one key and made one charge, and the retry got that charge.
    assert list(provider.requests.values()) == [2]
    assert len(provider.charges) == 1 and result == "ch_1"


def test_every_row_names_its_test() -> None:
    text = PAGE.read_text()
    table = text[text.index("| mode |") :].split("\n\n")[0].splitlines()[2:]
    named = [re.findall(r"`(test_\w+)`", line) for line in table]
    assert len(table) >= 4 and all(len(tests) == 1 for tests in named), table
    # The recovery points across a kill have a file of their own.
    sources = [Path(__file__), Path(__file__).with_name("test_steps_crash.py")]
    defined = {
        name
        for source in sources
        for name in re.findall(r"^(?:async )?def (test_\w+)", source.read_text(), re.M)
    }
    assert {tests[0] for tests in named} <= defined
    assert f"{LEASE:g} s" in text


async def test_recovery_points_resume_after_the_last_recorded_step() -> None:
    """In process, on the MemoryStore (which dies with its process: a kill would take the
    record with it): the call is cut off at its deadline inside its third step, after
    that step's effect — the record is left as a crash leaves it.  The retry waits for the
    lease, replays the two recorded steps, and runs the third again."""
    import httpx

    from idempotency_async import Manager, MemoryStore, Options, downstream_key, step

    provider = Provider()
    effects: Counter[str] = Counter()
    manager = Manager(MemoryStore(), Options(key_prefix="choose", event_key_jmespath="id"))
    dying = [True]

    async with serve_aio(provider.app) as url, httpx.AsyncClient(base_url=url) as client:

        async def charge() -> str:
            answer = await client.post(
                "/charges", headers={"Idempotency-Key": downstream_key("charge")}
            )
            return str(answer.json()["charge"])

        async def receipt() -> str:
            effects["receipt"] += 1
            if dying[0]:
                dying[0] = False
                await asyncio.sleep(60)  # hangs after its effect: cut off at the deadline
            return "sent"

        async def order() -> str:
            effects["order"] += 1
            return "o-1"

        async def place() -> str:
            await step("order", order)
            charged = await step("charge", charge)
            await step("receipt", receipt)
            return charged

        with pytest.raises(errors.DeadlineExceededError):
            await manager.execute({"id": "k"}, place, timeout=LEASE)
        started = time.monotonic()
        while True:
            try:
                result = await manager.execute({"id": "k"}, place, timeout=LEASE)
                break
            except errors.AlreadyInProgressError:
                assert time.monotonic() - started < 10, "the key stayed blocked"
                await asyncio.sleep(0.05)

    # The recorded steps ran once; the interrupted one ran again once the lease ended.
    assert effects == Counter({"order": 1, "receipt": 2})
    assert list(provider.requests.values()) == [1] and result == "ch_1"
