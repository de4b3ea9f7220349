"""Interop with the published TypeScript port's Redis layer, end to end, on one redis-server.

``tests/interop/ts_redis_worker.mjs`` runs a function made idempotent with
``@aws-lambda-powertools/idempotency`` (2.35.0) on its ``CachePersistenceLayer`` with a
``@redis/client`` connection, against the session's redis-server.  Each test shares one
database between that Node process and a Python ``Manager`` on ``RedisStore``, both ways:
keys, replays, payload validation and in-progress records.  The key cases and the response
are those of the DynamoDB interop (``test_typescript_interop.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as redis_asyncio
from _redis import RedisServer
from test_typescript_interop import (
    CALL_TIMEOUT,
    CASES,
    INSTALL_TIMEOUT,
    INTEROP_DIR,
    RESPONSE,
    WORKER_TIMEOUT,
    Case,
    TSOutcome,
    _child_env,
    _unavailable,
    assert_same_json,
    install_lock,
    must_not_run,
    node,
)

from idempotency_async import Manager, Options, step
from idempotency_async.errors import AlreadyInProgressError, PayloadValidationError
from idempotency_async.stores.redis import RedisStore

pytestmark = pytest.mark.redis

WORKER = INTEROP_DIR / "ts_redis_worker.mjs"
DATABASE = 5  # the interop tests' own database, flushed by each test

# The key cases of the DynamoDB interop; the worker always passes keyPrefix explicitly.
REDIS_CASES = CASES


@pytest.fixture(scope="session")
def redis_node(node: str) -> str:
    """``node``, with @redis/client installed next to the TypeScript port."""
    with install_lock():
        _install_redis_client()
    return node


def _install_redis_client() -> None:
    if not (INTEROP_DIR / "node_modules" / "@redis" / "client" / "package.json").is_file():
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=INTEROP_DIR,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            _unavailable(f"`npm ci` in {INTEROP_DIR} failed:\n{done.stderr[-3000:]}")


@pytest.fixture
async def shared_db(redis_server: RedisServer) -> AsyncIterator[redis_asyncio.Redis]:
    async with redis_server.client(db=DATABASE) as client:
        await client.flushdb()
        yield client


async def run_ts(
    node: str,
    server: RedisServer,
    case: Case,
    payload: Any = None,
    *,
    response: Any = None,
    mode: str = "run",
    payload_validation_jmespath: str | None = None,
) -> TSOutcome:
    """Run the port's idempotent function once (``mode="claim"``: only its claim)."""
    request = {
        "url": f"{server.url}/{DATABASE}",
        "payload": case.payload if payload is None else payload,
        "response": response,
        "keyPrefix": case.key_prefix,
        "eventKeyJmesPath": case.event_key_jmespath or "",
        "payloadValidationJmesPath": payload_validation_jmespath,
        "hashFunction": case.hash_function,
        "lambdaContext": case.lambda_context,
        "mode": mode,
    }
    process = await asyncio.create_subprocess_exec(
        node,
        str(WORKER),
        cwd=INTEROP_DIR,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_child_env(None),
    )
    try:
        async with asyncio.timeout(WORKER_TIMEOUT):
            stdout, stderr = await process.communicate(json.dumps(request).encode())
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"the TypeScript worker did not finish within {WORKER_TIMEOUT:.0f} s")
    lines = stdout.decode().strip().splitlines()
    if process.returncode != 0 or not lines:
        pytest.fail(
            f"the TypeScript worker exited with {process.returncode}\n"
            f"--- stdout ---\n{stdout.decode()[-3000:]}\n--- stderr ---\n{stderr.decode()[-3000:]}"
        )
    output = json.loads(lines[-1])
    return TSOutcome(output["ran"], output["returned"], output["result"], output["error"])


def manager_for(
    client: redis_asyncio.Redis, case: Case, *, payload_validation_jmespath: str | None = None
) -> Manager:
    options = Options(
        key_prefix=case.key_prefix,
        event_key_jmespath=case.event_key_jmespath,
        payload_validation_jmespath=payload_validation_jmespath,
        hash_function=case.hash_function,
    )
    return Manager(RedisStore(client), options)


async def only_record(client: redis_asyncio.Redis) -> tuple[str, dict[str, Any]]:
    keys = await client.keys("*")
    assert len(keys) == 1, keys
    raw = await client.get(keys[0])
    assert raw is not None
    record: dict[str, Any] = json.loads(raw)
    return keys[0].decode(), record


# -- TypeScript writes, Python replays --------------------------------------------------


@pytest.mark.parametrize("case", REDIS_CASES, ids=lambda case: case.name)
async def test_python_replays_a_typescript_record(
    redis_node: str, redis_server: RedisServer, shared_db: redis_asyncio.Redis, case: Case
) -> None:
    first = await run_ts(redis_node, redis_server, case, response=RESPONSE)
    assert first.error is None, first.error
    assert first.ran and first.returned

    manager = manager_for(shared_db, case)
    key, record = await only_record(shared_db)
    assert manager.key_for(case.payload) == key, "the Python key differs from the port's"
    assert record["status"] == "COMPLETED" and "owner" not in record
    assert await shared_db.ttl(key) > 3000

    replayed = await manager.execute(case.payload, must_not_run, timeout=CALL_TIMEOUT)
    assert_same_json(replayed, RESPONSE)


async def test_a_typescript_completion_drops_the_validation_hash(
    redis_node: str, redis_server: RedisServer, shared_db: redis_asyncio.Redis
) -> None:
    case = REDIS_CASES[0]
    claim = await run_ts(
        redis_node, redis_server, case, mode="claim", payload_validation_jmespath="amount"
    )
    assert claim.error is None, claim.error
    _, record = await only_record(shared_db)
    assert "validation" in record  # written with the claim
    await shared_db.flushdb()

    done = await run_ts(
        redis_node, redis_server, case, response=RESPONSE, payload_validation_jmespath="amount"
    )
    assert done.error is None, done.error
    _, record = await only_record(shared_db)
    assert "validation" not in record  # the port's completion does not keep it (docs/redis.md)
    manager = manager_for(shared_db, case, payload_validation_jmespath="amount")
    changed = {**case.payload, "amount": 13.5}
    replayed = await manager.execute(changed, must_not_run, timeout=CALL_TIMEOUT)
    assert_same_json(replayed, RESPONSE)


async def test_python_sees_a_typescript_claim_as_in_progress(
    redis_node: str, redis_server: RedisServer, shared_db: redis_asyncio.Redis
) -> None:
    case = next(case for case in REDIS_CASES if case.lambda_context)
    claim = await run_ts(redis_node, redis_server, case, mode="claim")
    assert claim.error is None, claim.error
    _, record = await only_record(shared_db)
    assert record["status"] == "INPROGRESS" and "in_progress_expiration" in record

    manager = manager_for(shared_db, case)
    with pytest.raises(AlreadyInProgressError) as refused:
        await manager.execute(case.payload, must_not_run, timeout=CALL_TIMEOUT)
    assert refused.value.retry_after is not None and 25 < refused.value.retry_after <= 30


# -- Python writes, TypeScript replays --------------------------------------------------


@pytest.mark.parametrize("case", REDIS_CASES, ids=lambda case: case.name)
async def test_typescript_replays_a_python_record(
    redis_node: str, redis_server: RedisServer, shared_db: redis_asyncio.Redis, case: Case
) -> None:
    manager = manager_for(shared_db, case)

    async def work() -> dict[str, Any]:
        return RESPONSE

    assert await manager.execute(case.payload, work, timeout=CALL_TIMEOUT) is RESPONSE
    key, record = await only_record(shared_db)
    assert key == manager.key_for(case.payload) and record["status"] == "COMPLETED"

    ts = await run_ts(redis_node, redis_server, case, response={"ran": "in TypeScript"})
    assert ts.error is None, ts.error
    assert not ts.ran, "the TypeScript function ran: the Python record was not replayed"
    assert_same_json(ts.result, RESPONSE)


async def test_typescript_reads_python_payload_validation(
    redis_node: str, redis_server: RedisServer, shared_db: redis_asyncio.Redis
) -> None:
    case = REDIS_CASES[0]
    manager = manager_for(shared_db, case, payload_validation_jmespath="amount")

    async def work() -> dict[str, Any]:
        return RESPONSE

    await manager.execute(case.payload, work, timeout=CALL_TIMEOUT)
    with pytest.raises(PayloadValidationError):
        await manager.execute({**case.payload, "amount": 13.5}, work, timeout=CALL_TIMEOUT)

    same = await run_ts(redis_node, redis_server, case, payload_validation_jmespath="amount")
    assert same.error is None and not same.ran
    assert_same_json(same.result, RESPONSE)
    changed = await run_ts(
        redis_node,
        redis_server,
        case,
        {**case.payload, "amount": 13.5},
        payload_validation_jmespath="amount",
    )
    assert not changed.ran
    assert changed.error is not None and changed.error["name"] == "IdempotencyValidationError"


async def test_typescript_sees_a_python_claim_as_in_progress(
    redis_node: str, redis_server: RedisServer, shared_db: redis_asyncio.Redis
) -> None:
    case = REDIS_CASES[1]
    manager = manager_for(shared_db, case)
    started, finish = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        started.set()
        await finish.wait()
        return "done"

    holder = asyncio.create_task(manager.execute(case.payload, slow, timeout=CALL_TIMEOUT))
    try:
        await started.wait()
        ts = await run_ts(redis_node, redis_server, case, response="ran twice")
        assert not ts.ran, "the TypeScript function ran while Python held the key"
        assert ts.error is not None
        assert ts.error["name"] == "IdempotencyAlreadyInProgressError", ts.error
    finally:
        finish.set()
        with contextlib.suppress(Exception):
            await holder
    assert holder.result() == "done"

    replay = await run_ts(redis_node, redis_server, case, response="ran after completion")
    assert not replay.ran and replay.result == "done"


# -- recovery points (steps) ------------------------------------------------------------


async def test_typescript_reads_a_python_claim_carrying_steps_as_in_progress(
    redis_node: str, redis_server: RedisServer, shared_db: redis_asyncio.Redis
) -> None:
    case = REDIS_CASES[1]
    manager = manager_for(shared_db, case)
    stepped, finish = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        await step("one", lambda: asyncio.sleep(0, {"data": ',"data":1}'}))
        stepped.set()
        await finish.wait()
        return "done"

    holder = asyncio.create_task(manager.execute(case.payload, slow, timeout=CALL_TIMEOUT))
    try:
        await stepped.wait()
        _, record = await only_record(shared_db)
        assert record["step_count"] == 1
        ts = await run_ts(redis_node, redis_server, case, response="ran twice")
        assert not ts.ran, "the TypeScript function ran while Python held the key"
        assert ts.error is not None
        assert ts.error["name"] == "IdempotencyAlreadyInProgressError", ts.error
    finally:
        finish.set()
        with contextlib.suppress(Exception):
            await holder
    assert holder.result() == "done"


async def test_typescript_takes_over_a_released_record_dropping_its_steps(
    redis_node: str, redis_server: RedisServer, shared_db: redis_asyncio.Redis
) -> None:
    # A released record (progress kept, no owner, its lease ended) reads as a lapsed claim
    # there: the port takes it over (its <key>:lock, then a plain SET) and runs its
    # function from the start (a non-fencing writer); its completion then replays here,
    # and nothing resumes.
    case = REDIS_CASES[1]
    manager = manager_for(shared_db, case)

    async def fails() -> str:
        await step("one", lambda: asyncio.sleep(0, 1))
        raise RuntimeError("after the step")

    with pytest.raises(RuntimeError):
        await manager.execute(case.payload, fails, timeout=CALL_TIMEOUT)
    key, record = await only_record(shared_db)
    assert record["step_count"] == 1 and "owner" not in record

    ts = await run_ts(redis_node, redis_server, case, response=RESPONSE)
    assert ts.ran and ts.error is None
    assert await shared_db.exists(f"{key}:lock")  # the port took its lock, as for any orphan
    record = json.loads(await shared_db.get(key))
    assert record["status"] == "COMPLETED" and "steps" not in record
    replayed = await manager.execute(case.payload, must_not_run, timeout=CALL_TIMEOUT)
    assert_same_json(replayed, RESPONSE)


__all__ = ["node"]
