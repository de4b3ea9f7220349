"""The Manager on DynamoDBStore over a real moto server: round trips and many processes."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _moto import fresh_store, fresh_table
from support import start_holding
from test_dynamodb_store import sent_requests

from idempotency_async import LocalCache, Manager, Options, errors

pytestmark = pytest.mark.dynamodb


async def _value() -> dict[str, Any]:
    return {"charged": True, "amount": 12.5}


async def test_store_round_trips_per_path(dynamodb_client: Any, store_client: Any) -> None:
    store = await fresh_store(dynamodb_client, store_client=store_client)
    first = Manager(store, Options(key_prefix="rt", local_cache=LocalCache()))
    second = Manager(store, Options(key_prefix="rt"))

    with sent_requests(store_client) as sent:
        await first.execute({"id": 1}, _value, timeout=10)
    assert sent == ["PutItem", "UpdateItem"]  # first call: claim + complete

    with sent_requests(store_client) as sent:
        assert await second.execute({"id": 1}, _value, timeout=10) == await _value()
    assert sent == ["PutItem"]  # replay: the failed claim returns the record

    with sent_requests(store_client) as sent:
        assert await first.execute({"id": 1}, _value, timeout=10) == await _value()
    assert sent == []  # cached replay

    release = asyncio.Event()
    holder = await start_holding(first, {"id": 2}, until=release, result="slow", timeout=10)
    with sent_requests(store_client) as sent, pytest.raises(errors.AlreadyInProgressError):
        await second.execute({"id": 2}, _value, timeout=10)
    assert sent == ["PutItem"]  # in-progress rejection from another process
    with sent_requests(store_client) as sent, pytest.raises(errors.AlreadyInProgressError):
        await first.execute({"id": 2}, _value, timeout=10)
    assert sent == []  # in-progress rejection in the same process
    release.set()
    assert await holder == "slow"


async def test_failed_claim_never_runs_the_callback(
    dynamodb_client: Any, store_client: Any
) -> None:
    store = await fresh_store(dynamodb_client, store_client=store_client)
    await dynamodb_client.delete_table(TableName=store.table_name)
    manager = Manager(store, Options(key_prefix="gone"))
    ran = False

    async def work() -> None:
        nonlocal ran
        ran = True

    with pytest.raises(errors.StoreValidationError):
        await manager.execute({"id": 1}, work, timeout=10)
    assert ran is False


@pytest.mark.parametrize("mixed", [False, True], ids=["aioboto3", "both-transports"])
async def test_four_processes_run_each_shared_key_once(
    dynamodb_client: Any, moto_endpoint: str, tmp_path: Path, mixed: bool
) -> None:
    # Mixed: two workers on aioboto3, two on the light transport, sharing the keys.
    table = await fresh_table(dynamodb_client)
    side_effects = tmp_path / "side-effects.log"
    worker = Path(__file__).with_name("_worker.py")
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(worker),
            moto_endpoint,
            table,
            str(side_effects),
            f"w{n}",
            "50",
            "20",
            "light" if mixed and n % 2 else "aioboto3",
            stderr=asyncio.subprocess.PIPE,
        )
        for n in range(4)
    ]
    for process in processes:
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
        assert process.returncode == 0, stderr.decode()[-3000:]
    lines = side_effects.read_text().splitlines()
    per_key = Counter(line.split()[0] for line in lines)
    assert per_key == Counter({str(key): 1 for key in range(20)})
