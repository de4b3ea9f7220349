"""``key_format="powertools-python"`` derives the keys aws-lambda-powertools (Python) derives.

Byte equality is proven against the real package, never against a re-implementation:
the corpus in ``_powertools_corpus`` runs through Powertools' own ``idempotent_function``
and ``@idempotent``, and through this library's ``idempotent_function`` and
``idempotent_handler`` on functions with the same module and qualified name.  Twice: with
the installed (newest) 3.x in this process, and with the oldest supported release, 3.0.0,
installed once into a cached directory and run in a subprocess.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _powertools_corpus as corpus
import pytest
from support import RecordingStore

from idempotency_async import Manager, MemoryStore, Options, idempotent_function
from idempotency_async._keys import key_deriver
from idempotency_async._prefixes import has_explicit_prefix
from idempotency_async.canonical import digest
from idempotency_async.errors import (
    ConfigError,
    KeyMissingError,
    PayloadError,
    PayloadValidationError,
)
from idempotency_async.integrations.aws_lambda import idempotent_handler

OLDEST = "3.0.0"
INSTALL_TIMEOUT = 180.0
TESTS_DIR = Path(__file__).parent


def installed_version() -> tuple[int, int]:
    from aws_lambda_powertools.shared.version import VERSION

    major, minor = VERSION.split(".")[:2]
    return int(major), int(minor)


@pytest.fixture(autouse=True)
def no_function_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)


async def our_keys(case: corpus.Case, version: str | None = None) -> tuple[str, str] | None:
    """(key, validation hash) this library claims for ``case``, through its decorators."""
    store = RecordingStore(MemoryStore())
    options = Options(
        key_format="powertools-python",
        powertools_version=version,
        event_key_jmespath=case.event_key_jmespath or None,
        payload_validation_jmespath=case.validation_jmespath,
        hash_function=case.hash_function,
        key_prefix=case.key_prefix,
    )
    manager = Manager(store, options)
    if case.kind == "handler":

        async def handler(event: Any, context: Any) -> dict[str, Any]:
            return dict(corpus.RESPONSE)

        # The same module and qualified name as the Powertools handler, as a migrated
        # handler keeps them.
        functools.update_wrapper(handler, corpus.handler)
        await idempotent_handler(manager)(handler)(case.payload, corpus.LambdaContext())
    else:

        async def process_order(order: Any) -> dict[str, Any]:
            return dict(corpus.RESPONSE)

        functools.update_wrapper(process_order, corpus.process_order)
        await idempotent_function(manager, payload="order")(process_order)(order=case.payload)
    if not store.claims:
        return None
    claim = store.claims[0]
    return claim.key, claim.validation or ""


@pytest.mark.parametrize("case", corpus.CASES, ids=lambda case: case.name)
async def test_keys_equal_the_installed_powertools(case: corpus.Case) -> None:
    if case.since > installed_version():
        pytest.skip(f"needs Powertools {case.since}")
    expected = corpus.powertools_keys(case)
    assert await our_keys(case) == expected


def test_the_corpus_covers_keys_validation_and_missing_keys() -> None:
    results = [corpus.powertools_keys(case) for case in corpus.CASES]
    assert sum(result is None for result in results) >= 4
    assert sum(bool(result and result[1]) for result in results) >= 4
    assert len({result for result in results if result is not None}) == sum(
        result is not None for result in results
    ), "two cases share a key: the corpus does not discriminate"


# -- the oldest supported release ---------------------------------------------------------


def _unavailable(reason: str) -> None:
    message = f"cannot run Powertools {OLDEST}: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(f"!!! SKIPPED, NOT PASSED: {message}")


def _oldest_package() -> Path:
    """A directory holding aws-lambda-powertools 3.0.0, installed once and reused."""
    target = Path(tempfile.gettempdir()) / f"idempotency-async-powertools-{OLDEST}"
    if (target / ".complete").exists():
        return target
    staging = Path(tempfile.mkdtemp(prefix="powertools-", dir=tempfile.gettempdir()))
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-deps", "--target", str(staging), f"aws-lambda-powertools=={OLDEST}",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        shutil.rmtree(staging, ignore_errors=True)
        _unavailable(f"`pip install` took longer than {INSTALL_TIMEOUT:.0f} s")
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        _unavailable(f"`pip install` failed:\n{done.stderr[-2000:]}")
    (staging / ".complete").touch()
    try:
        staging.rename(target)  # atomic: a concurrent run finds it whole or not at all
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another run got there first
    return target


def run_oldest(*args: str) -> Any:
    """Run ``_powertools_corpus._cli(args)`` with Powertools 3.0.0; return its JSON output."""
    package = _oldest_package()
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from aws_lambda_powertools.shared.version import VERSION; "
        f"assert VERSION == {OLDEST!r}, VERSION; "
        "import _powertools_corpus; _powertools_corpus._cli(sys.argv[2:])"
    )
    env = {**os.environ, "PYTHONPATH": str(package)}
    env.pop("AWS_LAMBDA_FUNCTION_NAME", None)
    done = subprocess.run(
        [sys.executable, "-c", script, str(TESTS_DIR), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def oldest_keys() -> dict[str, Any]:
    keys: dict[str, Any] = run_oldest("keys", "3.0")
    return keys


@pytest.mark.parametrize(
    "case", [case for case in corpus.CASES if case.since <= (3, 0)], ids=lambda case: case.name
)
async def test_keys_equal_powertools_3_0(case: corpus.Case, oldest_keys: dict[str, Any]) -> None:
    expected = oldest_keys[case.name]
    ours = await our_keys(case, version="3.0")
    assert ours == (None if expected is None else tuple(expected))
    if case.name in corpus.CHANGED_IN_3X:
        # The version matters here: the latest rules give another key (or none).
        assert await our_keys(case) != ours


# -- options and rules --------------------------------------------------------------------


def test_powertools_prefix_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    options = Options(key_format="powertools-python")
    assert options.resolved_prefix() == "test-func."
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", " orders ")
    assert options.resolved_prefix() == " orders ."  # Powertools does not trim
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "")
    assert options.resolved_prefix() == "."  # set but empty: no "test-func"
    spaced = Options(key_format="powertools-python", key_prefix=" p ")
    assert has_explicit_prefix(spaced.key_prefix, spaced.key_format)
    assert spaced.resolved_prefix() == " p "


async def test_decorated_function_prefix_uses_the_lambda_function_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "orders-fn")
    case = corpus.Case("fn", {"id": "o-1"}, "id")
    ours = await our_keys(case)
    assert ours is not None
    assert ours[0].startswith("orders-fn._powertools_corpus.process_order#")
    assert ours == corpus.powertools_keys(case)


def test_typescript_keys_are_untouched() -> None:
    payload = {"id": "o-1", "n": 1.0}
    ts = key_deriver(Options(key_prefix="p")).derive(payload)
    python = key_deriver(Options(key_prefix="p", key_format="powertools-python")).derive(payload)
    assert ts is not None and python is not None
    assert ts.key == "p#" + digest('{"id":"o-1","n":1}')
    assert python.key == "p#" + hashlib.md5(b'{"id": "o-1", "n": 1.0}').hexdigest()
    assert ts.key != python.key


def test_validation_mismatch_when_the_record_has_no_hash() -> None:
    # Powertools compares whenever validation is on: a record written without a validation
    # hash does not match.
    deriver = key_deriver(
        Options(key_format="powertools-python", payload_validation_jmespath="amount")
    )
    keys = deriver.derive({"amount": 1})
    assert keys is not None and keys.validation is not None
    deriver.validate(keys.validation, keys)
    with pytest.raises(PayloadValidationError):
        deriver.validate(None, keys)
    with pytest.raises(PayloadValidationError):
        deriver.validate("0" * 32, keys)


def test_raise_on_no_key_follows_powertools_missing_rule() -> None:
    deriver = key_deriver(
        Options(key_format="powertools-python", event_key_jmespath="id", raise_on_no_key=True)
    )
    for missing in ({"id": ""}, {"id": []}, {"id": {}}, {"id": None}, {}):
        with pytest.raises(KeyMissingError):
            deriver.derive(missing)
    assert deriver.derive({"id": 0}) is not None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"key_format": "powertools"}, "key_format must be one of"),
        ({"powertools_version": "3.0"}, "applies only to key_format='powertools-python'"),
        ({"key_format": "powertools-python", "powertools_version": "2.43"}, "3.x release"),
        ({"key_format": "powertools-python", "powertools_version": "latest"}, "3.x release"),
        (
            {"key_format": "powertools-python", "integer_precision": "float64"},
            "integer_precision applies only",
        ),
        (
            {"key_format": "powertools-python", "strict_missing_key": True},
            "strict_missing_key applies only",
        ),
        ({"hash_function": "sha3_256"}, "unknown hash_function"),
        ({"key_format": "powertools-python", "hash_function": "shake_128"}, "unknown hash"),
    ],
)
def test_invalid_key_format_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Options(**options)


def test_versions_parse() -> None:
    for text in ("3", "3.0", "3.27.1", "3.40"):
        Options(key_format="powertools-python", powertools_version=text)


def test_manager_refuses_a_store_of_the_other_record_format() -> None:
    class PowertoolsFormatStore(MemoryStore):
        record_format = "powertools-python"

    with pytest.raises(ConfigError, match="record_format='typescript'"):
        Manager(PowertoolsFormatStore(), Options())
    Manager(PowertoolsFormatStore(), Options(key_format="powertools-python"))


async def test_http_integration_with_a_powertools_only_hash() -> None:
    # The request fingerprint is hashed with the manager's algorithm when this library
    # knows it, with sha256 otherwise: sha3_256 works end to end.
    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    from idempotency_async.integrations.aiohttp import (
        idempotency_middleware,
        idempotent_endpoint,
    )

    options = Options(key_format="powertools-python", hash_function="sha3_256", key_prefix="api")
    manager = Manager(MemoryStore(), options)
    app = web.Application(middlewares=[idempotency_middleware(manager, required=True)])
    runs = 0

    @idempotent_endpoint
    async def create(request: web.Request) -> web.Response:
        nonlocal runs
        runs += 1
        return web.json_response({"run": runs}, status=201)

    app.router.add_post("/orders", create)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with ClientSession() as session:
            for _ in range(2):
                async with session.post(
                    server.make_url("/orders"), json={"sku": "A"}, headers={"Idempotency-Key": "k1"}
                ) as response:
                    assert response.status == 201
                    assert await response.json() == {"run": 1}
            async with session.post(
                server.make_url("/orders"), json={"sku": "B"}, headers={"Idempotency-Key": "k1"}
            ) as response:
                assert response.status == 422  # the fingerprint differs
    finally:
        await server.close()
    assert runs == 1


def test_values_powertools_cannot_write_are_payload_errors() -> None:
    class Opaque:
        pass

    class JsonLike:
        json = True  # Powertools takes this for a pydantic model

    deriver = key_deriver(Options(key_format="powertools-python"))
    for value in ({"x": Opaque()}, {"x": JsonLike()}, {"x": {1, 2}}, {1: "a", "b": 2}):
        with pytest.raises(PayloadError, match="Powertools"):
            deriver.derive(value)
    # Options.serializer handles what Powertools cannot write, and nothing else.
    serialized = key_deriver(
        Options(key_format="powertools-python", serializer=lambda value: sorted(value))
    )
    assert serialized.derive({"x": {2, 1}}) == deriver.derive({"x": [1, 2]})
