"""Interop with the published TypeScript port, end to end, on one moto table.

``tests/interop/ts_worker.mjs`` runs a function made idempotent with
``@aws-lambda-powertools/idempotency`` (2.35.0, the version the key vectors came from) and
its ``DynamoDBPersistenceLayer`` against the session's moto server.  Each test shares a
fresh table between that Node process and a Python ``Manager`` on ``DynamoDBStore``:

* TypeScript writes, Python replays: the key Python derives equals the ``id`` the port
  wrote, the Python callback never runs, and the replay has the port's values and types;
* Python writes, TypeScript replays: the port's function never runs and returns exactly
  the Python response.

How the port builds a key (2.35.0, ``BasePersistenceLayer``): ``makeIdempotent`` passes
only its ``keyPrefix`` option to ``configure``; the prefix is ``keyPrefix.trim()`` when
that is non-blank, else the trimmed ``AWS_LAMBDA_FUNCTION_NAME`` (no function-name suffix
on this path).  The key is ``<prefix>#<base64(md5(JSON.stringify(deepSort(selection))))>``.

The npm packages are installed into ``tests/interop/node_modules`` on first use (``npm ci``
from the committed lock file).  Without Node or npm the tests skip loudly, or fail when
``CI=true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from _moto import REGION, fresh_table, open_client, open_light_client

from idempotency_async import Manager, Options, step
from idempotency_async.errors import AlreadyInProgressError, PayloadValidationError
from idempotency_async.stores.dynamodb import DynamoDBStore

pytestmark = pytest.mark.dynamodb

INTEROP_DIR = Path(__file__).parent / "interop"
WORKER = INTEROP_DIR / "ts_worker.mjs"
TS_PACKAGE = "@aws-lambda-powertools/idempotency"
TS_VERSION = "2.35.0"
INSTALL_TIMEOUT = 300.0
WORKER_TIMEOUT = 60.0
CALL_TIMEOUT = 20.0

# A response using every JSON type, nested.  No whole-number floats: JavaScript has one
# number type, so a TypeScript 2.0 is the integer 2 everywhere (and a Python 2.0 is stored
# as JSON text, see docs/dynamodb.md).  No number beyond ±(2**53-1) either: the TypeScript
# SDK's marshall refuses them, floats included, and unmarshall reads integers as BigInt
# (test at the end).
RESPONSE: dict[str, Any] = {
    "statusCode": 201,
    "ok": True,
    "failed": False,
    "nothing": None,
    "message": "commande acceptée ✓ 😀",
    "empty": "",
    "zero": 0,
    "negative": -17,
    "maxSafe": 9007199254740991,
    "amount": 129.95,
    "tiny": 1e-7,
    "large": 4503599627370495.5,
    "negativeFloat": -0.25,
    "order": {
        "id": "o-1001",
        "lines": [
            {"sku": "A-1", "qty": 2, "price": 19.99, "tags": ["red", "small"]},
            {"sku": "B-2", "qty": 1, "price": 90.01, "tags": []},
        ],
        "address": {"City": "Zürich", "zip": "8001", "geo": [47.3769, 8.5417]},
        "meta": {},
    },
    "mixed": [1, 2.5, "three", None, True, [False, {"deep": [{"deeper": "yes"}]}]],
}

# Payloads whose key selection exercises canonical ordering: mixed-case keys sorted by
# their lowercase form (stable for ties), array-index keys first, non-ASCII, U+2028,
# control characters, floats printed the JavaScript way (1.0 -> 1, -0.0 -> 0, 1e21,
# 1e-7), nested objects and arrays.
CANONICAL_ID: dict[str, Any] = {
    "Zebra": 1,
    "apple": [1.0, 2.5, 1e21, 1e-7, -0.0, 123456789.125],
    "Äpfel": "grün",
    "émoji": "😀 ✓",
    "b": 1,
    "B": 2,
    "a": 3,
    "A": 4,
    "10": "ten",
    "2": "two",
    "nested": {"y": True, "X": None, "x": [{"Q": 0.1, "p": -3}]},
    "line\u2028sep": "tab\there\u0001",
    "_under": "score",
}


@dataclass(frozen=True)
class Case:
    """One key configuration, applied identically on both sides."""

    name: str
    payload: Any
    event_key_jmespath: str | None
    key_prefix: str
    hash_function: str = "md5"
    # Run the port's function as a Lambda handler (event, context).
    lambda_context: bool = False
    # Pass the prefix to the port through AWS_LAMBDA_FUNCTION_NAME instead of keyPrefix.
    prefix_from_function_name: bool = False


CASES = [
    Case(
        "simple-id",
        {"id": "order-1001", "amount": 12.5, "customer": {"name": "Ada"}},
        event_key_jmespath="id",
        key_prefix="process-order",
    ),
    Case(
        "canonical-ordering",
        {"id": CANONICAL_ID, "requestId": "differs-per-delivery"},
        event_key_jmespath="id",
        key_prefix="process-order",
    ),
    Case(
        "whole-event-sha256",
        {"id": 42, "Body": {"Items": [3.25, {"k": "ü"}]}, "a": None, "B": [True, False]},
        event_key_jmespath=None,
        key_prefix="whole",
        hash_function="sha256",
    ),
    Case(
        "lambda-handler-prefix-from-function-name",
        {"id": {"Tenant": "t-1", "order": 7}, "headers": {"X-Trace": "abc"}},
        event_key_jmespath="id",
        key_prefix="orders-fn",
        lambda_context=True,
        prefix_from_function_name=True,
    ),
]


# -- installing and running the Node worker -----------------------------------------


def _unavailable(reason: str) -> NoReturn:
    message = f"TypeScript interop cannot run: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(f"!!! SKIPPED, NOT PASSED: {message}")


def _installed_version() -> str | None:
    manifest = INTEROP_DIR / "node_modules" / TS_PACKAGE / "package.json"
    try:
        version = json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None
    return str(version)


@contextlib.contextmanager
def install_lock() -> Iterator[None]:
    """Held while checking and installing tests/interop/node_modules: the suite's worker
    processes (pytest-xdist) each ask for it, and two `npm ci` in one folder collide."""
    with open(INTEROP_DIR / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def node() -> str:
    """Path of ``node``, with the pinned packages installed in tests/interop/node_modules."""
    node_path = shutil.which("node")
    if node_path is None:
        _unavailable("`node` is not on PATH (Node 18+ is needed)")
    with install_lock():
        _install()
    return node_path


def _install() -> None:
    if _installed_version() != TS_VERSION:
        npm = shutil.which("npm")
        if npm is None:
            _unavailable("`npm` is not on PATH, and tests/interop/node_modules is missing")
        lock = (INTEROP_DIR / "package-lock.json").is_file()
        command = [npm, "ci" if lock else "install", "--no-audit", "--no-fund"]
        try:
            done = subprocess.run(
                command,
                cwd=INTEROP_DIR,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            _unavailable(f"`{' '.join(command)}` in {INTEROP_DIR} failed: {exc}")
        if done.returncode != 0:
            _unavailable(
                f"`{' '.join(command)}` in {INTEROP_DIR} exited with {done.returncode}:\n"
                f"{done.stderr[-3000:]}"
            )
        if _installed_version() != TS_VERSION:
            _unavailable(f"npm did not install {TS_PACKAGE}@{TS_VERSION}")


def _child_env(function_name: str | None) -> dict[str, str]:
    """The worker's environment: dummy credentials, nothing AWS-related of this machine."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AWS_", "POWERTOOLS_", "NODE_OPTIONS"))
    }
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
    )
    if function_name is not None:
        env["AWS_LAMBDA_FUNCTION_NAME"] = function_name
    return env


@dataclass(frozen=True)
class TSOutcome:
    ran: bool
    returned: bool
    result: Any
    error: dict[str, str] | None


async def run_ts(
    node: str,
    endpoint: str,
    table: str,
    case: Case,
    payload: Any = None,
    *,
    response: Any = None,
    mode: str = "run",
    payload_validation_jmespath: str | None = None,
) -> TSOutcome:
    """Run the port's idempotent function once (``mode="claim"``: only its claim)."""
    request = {
        "endpoint": endpoint,
        "table": table,
        "payload": case.payload if payload is None else payload,
        "response": response,
        "keyPrefix": None if case.prefix_from_function_name else case.key_prefix,
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
        env=_child_env(case.key_prefix if case.prefix_from_function_name else None),
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


# -- Python side ----------------------------------------------------------------------


@pytest.fixture
async def shared_table(moto_endpoint: str, transport: str) -> AsyncIterator[tuple[Any, str]]:
    """A client of each DynamoDB transport and a fresh table on the moto server both sides
    use (the Python side's store and raw reads go through that client)."""
    async with open_client(moto_endpoint) as client:
        table = await fresh_table(client)
        if transport == "aioboto3":
            yield client, table
            return
        async with open_light_client(moto_endpoint) as light:
            yield light, table


def manager_for(
    client: Any, table: str, case: Case, *, payload_validation_jmespath: str | None = None
) -> Manager:
    options = Options(
        key_prefix=case.key_prefix,
        event_key_jmespath=case.event_key_jmespath,
        payload_validation_jmespath=payload_validation_jmespath,
        hash_function=case.hash_function,
    )
    return Manager(DynamoDBStore(client, table_name=table), options)


async def must_not_run() -> Any:
    raise AssertionError("the Python callback ran: the TypeScript record was not replayed")


async def raw_item(client: Any, table: str, key: str) -> dict[str, Any] | None:
    response = await client.get_item(TableName=table, Key={"id": {"S": key}}, ConsistentRead=True)
    item: dict[str, Any] | None = response.get("Item")
    return item


async def only_item(client: Any, table: str) -> dict[str, Any]:
    """The single item in ``table`` (whatever its key), to compare keys with."""
    items = (await client.scan(TableName=table, ConsistentRead=True))["Items"]
    assert len(items) == 1, f"expected one record in the table, found {items}"
    item: dict[str, Any] = items[0]
    return item


def assert_same_json(actual: Any, expected: Any, path: str = "$") -> None:
    """Equal JSON values with equal Python types (1 is not 1.0, True is not 1)."""
    assert type(actual) is type(expected), (
        f"{path}: got {type(actual).__name__} {actual!r}, "
        f"expected {type(expected).__name__} {expected!r}"
    )
    if isinstance(expected, dict):
        assert sorted(actual) == sorted(expected), f"{path}: keys {sorted(actual)}"
        for name, value in expected.items():
            assert_same_json(actual[name], value, f"{path}.{name}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for index, (left, right) in enumerate(zip(actual, expected, strict=True)):
            assert_same_json(left, right, f"{path}[{index}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


# -- TypeScript writes, Python replays ----------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
async def test_python_replays_a_typescript_record(
    node: str, moto_endpoint: str, shared_table: tuple[Any, str], case: Case
) -> None:
    client, table = shared_table
    first = await run_ts(node, moto_endpoint, table, case, response=RESPONSE)
    assert first.error is None, first.error
    assert first.ran and first.returned
    assert_same_json(first.result, RESPONSE)

    manager = manager_for(client, table, case)
    key = manager.key_for(case.payload)
    written = await only_item(client, table)
    assert key == written["id"]["S"], (
        f"the Python key differs from the key the TypeScript port wrote: {written['id']}"
    )
    assert written["status"] == {"S": "COMPLETED"}
    assert "data_format" not in written and "owner" not in written
    assert ("in_progress_expiration" in written) == case.lambda_context

    replayed = await manager.execute(case.payload, must_not_run, timeout=CALL_TIMEOUT)
    assert_same_json(replayed, RESPONSE)


async def test_python_reads_typescript_payload_validation(
    node: str, moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    case = CASES[0]
    ts = await run_ts(
        node, moto_endpoint, table, case, response=RESPONSE, payload_validation_jmespath="amount"
    )
    assert ts.error is None, ts.error
    manager = manager_for(client, table, case, payload_validation_jmespath="amount")
    written = await raw_item(client, table, manager.key_for(case.payload) or "")
    assert written is not None and "validation" in written

    replayed = await manager.execute(case.payload, must_not_run, timeout=CALL_TIMEOUT)
    assert_same_json(replayed, RESPONSE)
    with pytest.raises(PayloadValidationError):
        await manager.execute({**case.payload, "amount": 13.5}, must_not_run, timeout=CALL_TIMEOUT)


async def test_python_sees_a_typescript_claim_as_in_progress(
    node: str, moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    # makeIdempotent on a plain function claims without in_progress_expiration: the
    # record blocks the key until it expires, in both ports.
    client, table = shared_table
    case = CASES[1]
    ts = await run_ts(node, moto_endpoint, table, case, mode="claim")
    assert ts.error is None, ts.error
    manager = manager_for(client, table, case)
    written = await raw_item(client, table, manager.key_for(case.payload) or "")
    assert written is not None and written["status"] == {"S": "INPROGRESS"}

    with pytest.raises(AlreadyInProgressError):
        await manager.execute(case.payload, must_not_run, timeout=CALL_TIMEOUT)


# -- Python writes, TypeScript replays ----------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
async def test_typescript_replays_a_python_record(
    node: str, moto_endpoint: str, shared_table: tuple[Any, str], case: Case
) -> None:
    client, table = shared_table
    manager = manager_for(client, table, case)
    calls = 0

    async def work() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return RESPONSE

    assert await manager.execute(case.payload, work, timeout=CALL_TIMEOUT) is RESPONSE
    assert calls == 1
    written = await raw_item(client, table, manager.key_for(case.payload) or "")
    assert written is not None and written["status"] == {"S": "COMPLETED"}
    assert "data_format" not in written, "a response TypeScript can read is stored natively"

    ts = await run_ts(
        node, moto_endpoint, table, case, response={"ran": "in TypeScript, which it must not"}
    )
    assert ts.error is None, ts.error
    assert not ts.ran, "the TypeScript function ran: the Python record was not replayed"
    assert ts.returned
    assert_same_json(ts.result, RESPONSE)


async def test_typescript_reads_python_payload_validation(
    node: str, moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    case = CASES[0]
    manager = manager_for(client, table, case, payload_validation_jmespath="amount")

    async def work() -> dict[str, Any]:
        return RESPONSE

    await manager.execute(case.payload, work, timeout=CALL_TIMEOUT)

    same = await run_ts(
        node, moto_endpoint, table, case, response=None, payload_validation_jmespath="amount"
    )
    assert same.error is None, same.error
    assert not same.ran
    assert_same_json(same.result, RESPONSE)

    changed = await run_ts(
        node,
        moto_endpoint,
        table,
        case,
        {**case.payload, "amount": 13.5},
        payload_validation_jmespath="amount",
    )
    assert not changed.ran
    assert changed.error is not None and changed.error["name"] == "IdempotencyValidationError"


async def test_typescript_sees_a_python_claim_as_in_progress(
    node: str, moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    client, table = shared_table
    case = CASES[1]
    manager = manager_for(client, table, case)
    started = asyncio.Event()
    finish = asyncio.Event()

    async def slow() -> str:
        started.set()
        await finish.wait()
        return "done"

    holder = asyncio.create_task(manager.execute(case.payload, slow, timeout=CALL_TIMEOUT))
    try:
        await started.wait()
        ts = await run_ts(node, moto_endpoint, table, case, response="ran twice")
        assert not ts.ran, "the TypeScript function ran while Python held the key"
        assert ts.error is not None
        assert ts.error["name"] == "IdempotencyAlreadyInProgressError", ts.error
    finally:
        finish.set()
        with contextlib.suppress(Exception):
            await holder
    assert holder.result() == "done"

    replay = await run_ts(node, moto_endpoint, table, case, response="ran after completion")
    assert not replay.ran
    assert replay.result == "done"


async def test_typescript_claims_a_released_record_with_steps_and_drops_them(
    node: str, moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    # Python's call recorded a step, then raised: the record is released with its progress
    # kept (no owner, a lease end long past).  The port reads it as a lapsed claim, takes
    # it over with its PutItem and runs: a writer that does not fence (G1(e)).
    client, table = shared_table
    case = CASES[0]
    manager = manager_for(client, table, case)

    async def fails_after_a_step() -> str:
        await step("create", lambda: asyncio.sleep(0, {"order": "o1"}))
        raise RuntimeError("after the step")

    with pytest.raises(RuntimeError):
        await manager.execute(case.payload, fails_after_a_step, timeout=CALL_TIMEOUT)
    key = manager.key_for(case.payload) or ""
    released = await raw_item(client, table, key)
    assert released is not None and "owner" not in released and "steps" in released

    ts = await run_ts(node, moto_endpoint, table, case, response={"by": "typescript"})
    assert ts.error is None, ts.error
    assert ts.ran and ts.returned
    written = await raw_item(client, table, key)
    assert written is not None and written["status"] == {"S": "COMPLETED"}
    assert "steps" not in written and "step_count" not in written
    assert await manager.execute(case.payload, must_not_run, timeout=CALL_TIMEOUT) == {
        "by": "typescript"
    }


# -- key prefix ---------------------------------------------------------------------------


async def test_padded_key_prefix_matches_typescript(
    node: str, moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    """The port trims ``keyPrefix`` (``keyPrefix.trim()``); a prefix read from
    configuration with stray whitespace must still give both ports one key."""
    client, table = shared_table
    case = Case("padded", {"id": "order-7"}, event_key_jmespath="id", key_prefix=" orders\n")
    ts = await run_ts(node, moto_endpoint, table, case, response=RESPONSE)
    assert ts.error is None, ts.error
    written = await only_item(client, table)
    manager = manager_for(client, table, case)
    assert manager.key_for(case.payload) == written["id"]["S"], (
        f"Python key {manager.key_for(case.payload)!r}, TypeScript key {written['id']['S']!r}"
    )


async def test_typescript_key_matches_a_fresh_uuid_payload(
    node: str, moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    """A plain string id, new each run, so nothing can pass by a cached coincidence."""
    client, table = shared_table
    case = Case("uuid", {"id": str(uuid.uuid4())}, event_key_jmespath="id", key_prefix="")
    ts = await run_ts(node, moto_endpoint, table, case, response=[1, "two", 3.5])
    assert ts.error is None, ts.error
    manager = manager_for(client, table, case)
    key = manager.key_for(case.payload)
    assert key is not None and key.startswith("#")
    assert key == (await only_item(client, table))["id"]["S"]
    replayed = await manager.execute(case.payload, must_not_run, timeout=CALL_TIMEOUT)
    assert_same_json(replayed, [1, "two", 3.5])


async def test_typescript_reads_python_integers_beyond_2_53_as_bigint(
    node: str, moto_endpoint: str, shared_table: tuple[Any, str]
) -> None:
    """2**60 is stored exactly as a native N; the pinned TypeScript SDK's ``unmarshall``
    returns it as a BigInt (exact, but not a JavaScript number: ``JSON.stringify`` of the
    handler's result then throws).  Non-integer number text beyond 2**53 it refuses."""
    client, table = shared_table
    case = CASES[0]
    manager = manager_for(client, table, case)

    async def work() -> dict[str, Any]:
        return {"big": 2**60, "small": -3}

    await manager.execute(case.payload, work, timeout=CALL_TIMEOUT)
    written = await raw_item(client, table, manager.key_for(case.payload) or "")
    assert written is not None
    assert written["data"] == {"M": {"big": {"N": str(2**60)}, "small": {"N": "-3"}}}

    ts = await run_ts(node, moto_endpoint, table, case, response="ran")
    assert ts.error is None, ts.error
    assert not ts.ran
    assert_same_json(ts.result, {"big": {"$bigint": str(2**60)}, "small": -3})
