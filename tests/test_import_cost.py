"""What importing the library must not load: a Lambda pays for every module at cold start.

Each check runs a fresh interpreter and looks at ``sys.modules`` after the import, so a
module that starts importing something heavy at the top fails here, not in a benchmark
nobody reads.  Timings are measured in ``benchmarks/bench_import.py`` (CI runs its smoke
check against the import budget) and ``benchmarks/bench_cold_start.py``, never asserted
here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Loaded only by the code that uses them: AWS SDKs and HTTP clients by the stores and
# integrations that need them, telemetry by ``idempotency_async.otel``, the Powertools
# (Python) key rules by ``key_format="powertools-python"``.
_NEVER_AT_IMPORT = (
    "boto3",
    "botocore",
    "aioboto3",
    "aiobotocore",
    "aiohttp",
    "httpx",
    "h11",
    "redis",
    "valkey",
    "starlette",
    "fastapi",
    "opentelemetry",
    "aws_lambda_powertools",
    "mcp",
    "mcp_types",
    "pydantic",
    "hypothesis",
    # The standard library's heavier modules the general path and one JMESPath function
    # use: loaded by whoever uses Decimal, or powertools_base64_gzip.
    "decimal",
    "gzip",
    "idempotency_async._powertools_python",
    "idempotency_async.cli",
    "idempotency_async.integrations",
    "idempotency_async.otel",
    "idempotency_async.testing",
    "idempotency_async.stores.dynamodb",
    "idempotency_async.stores.dynamodb_light",
    "idempotency_async.stores.redis",
)


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return set(json.loads(done.stdout))


def _offending(loaded: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        name for name in loaded if any(name == f or name.startswith(f + ".") for f in forbidden)
    )


def test_importing_the_library_loads_nothing_the_call_does_not_use() -> None:
    loaded = _loaded_after("import idempotency_async")
    assert "idempotency_async.manager" in loaded  # the check itself sees our modules
    assert _offending(loaded, _NEVER_AT_IMPORT) == []


@pytest.mark.parametrize(
    "module",
    ["idempotency_async.stores.dynamodb", "idempotency_async.stores.dynamodb_light"],
)
def test_the_dynamodb_store_modules_load_no_aws_sdk(module: str) -> None:
    # The light transport's point: a cold start without botocore.  The store module
    # itself must not pull the SDK in either; an aioboto3 user imports it anyway.
    loaded = _loaded_after(f"import {module}")
    assert module in loaded
    sdk = ("boto3", "botocore", "aioboto3", "aiobotocore", "aiohttp", "httpx")
    assert _offending(loaded, (*sdk, "idempotency_async._powertools_python")) == []


def test_the_powertools_key_format_still_loads_its_rules() -> None:
    # The lazy import must still happen when the format is chosen.
    loaded = _loaded_after(
        "from idempotency_async import Manager, MemoryStore, Options\n"
        "Manager(MemoryStore(), Options(key_format='powertools-python'))"
    )
    assert "idempotency_async._powertools_python" in loaded
