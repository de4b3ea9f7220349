"""The ``idempotency-async`` command, run as a subprocess against the moto server.

Each subprocess costs about half a second, so independent runs go in concurrent batches.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from _cli import ROOT, cli, cli_env
from _moto import REGION, open_client
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from idempotency_async import Manager, Options, idempotent_function
from idempotency_async._keys import KeyDeriver
from idempotency_async.events import Event
from idempotency_async.integrations.aiohttp import idempotency_middleware, idempotent_endpoint
from idempotency_async.record import Claim, Completion
from idempotency_async.stores.dynamodb import DynamoDBStore, create_table
from idempotency_async.stores.memory import MemoryStore

VECTORS = json.loads((ROOT / "tests" / "data" / "ts_canonical_vectors.json").read_text())


def _url(endpoint: str, table: str, **params: str) -> str:
    query = "&".join(f"{name}={quote(value, safe='')}" for name, value in params.items())
    return f"dynamodb://{table}?region={REGION}&endpoint={quote(endpoint, safe='')}" + (
        f"&{query}" if query else ""
    )


def _table() -> str:
    return f"cli-{uuid.uuid4().hex[:12]}"


# ------------------------------------------------------------------------------ key

KEYS_SEEN: list[str] = []


def _record_key(event: Event) -> None:
    if event.kind == "claimed":
        KEYS_SEEN.append(event.key)


async def charge(order: dict[str, Any]) -> str:
    return "charged"


async def _decorated_key(options: Options, order: dict[str, Any]) -> str:
    """The key the decorator really claims for ``charge`` (seen through the event hook)."""
    KEYS_SEEN.clear()
    manager = Manager(MemoryStore(), Options(**{**_fields(options), "on_event": _record_key}))
    await idempotent_function(manager, payload="order")(charge)(order)
    (key,) = KEYS_SEEN
    return key


def _fields(options: Options) -> dict[str, Any]:
    return {name: getattr(options, name) for name in ("key_prefix", "event_key_jmespath")}


async def test_key_is_byte_identical_to_the_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vector = VECTORS[0]
    payload = {"order_id": 7, "customer": "c-1", "amount": 1250}
    (tmp_path / "order.json").write_text(json.dumps(payload))
    (tmp_path / "vector.json").write_text(vector["input_json"])
    options = Options(
        key_prefix="svc",
        event_key_jmespath="[order_id, customer]",
        payload_validation_jmespath="amount",
        hash_function="sha256",
    )
    selected = ["--prefix", "svc", "--jmespath", "[order_id, customer]"]
    in_lambda = cli_env(AWS_LAMBDA_FUNCTION_NAME="checkout-fn")
    runs = await asyncio.gather(
        cli("key", str(tmp_path / "vector.json")),
        cli("key", "--hash", "sha256", "--prefix", "svc", "-", stdin=vector["input_json"]),
        cli(
            "key",
            str(tmp_path / "order.json"),
            *selected,
            "--validation-jmespath",
            "amount",
            "--hash",
            "sha256",
            "--json",
        ),
        cli("key", "--function", "test_cli:charge", "--jmespath", "order_id", stdin="{}"),
        cli("key", "--function", "test_cli:charge", str(tmp_path / "order.json")),
        cli("key", "--function", "test_cli:charge", str(tmp_path / "order.json"), env=in_lambda),
        cli("key", "--function", "test_cli:charge", *selected, str(tmp_path / "order.json")),
    )
    vector_key, sha_key, with_validation, no_key, function, in_lambda_run, explicit = runs
    # Byte-identical with the TypeScript port's vectors, through the command line.
    assert vector_key.ok() == f"#{vector['md5_b64']}\n"
    assert sha_key.ok() == f"svc#{vector['sha256_b64']}\n"
    keys = KeyDeriver(options).derive(payload)
    assert keys is not None
    assert with_validation.json() == {"key": keys.key, "validation": keys.validation}
    assert keys.key == Manager(MemoryStore(), options).key_for(payload)
    assert "no idempotency key" in no_key.error()
    # A decorated function's per-function prefix, as the decorator really claims it.
    assert function.ok() == await _decorated_key(Options(), payload) + "\n"
    assert function.out.startswith("test_cli.charge#")
    explicit_key = await _decorated_key(
        Options(key_prefix="svc", event_key_jmespath="[order_id, customer]"), payload
    )
    assert explicit.ok() == explicit_key + "\n"  # an explicit prefix gets no suffix
    assert explicit_key.startswith("svc#")
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "checkout-fn")
    assert in_lambda_run.ok() == await _decorated_key(Options(), payload) + "\n"
    assert in_lambda_run.out.startswith("checkout-fn.test_cli.charge#")


async def test_key_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "dup.json").write_text('{"a": 1, "a": 2}')
    runs = await asyncio.gather(
        cli("key", stdin="{not json"),
        cli("key", str(tmp_path / "dup.json")),
        cli("key", str(tmp_path / "missing.json")),
        cli("key", "--function", "charge", stdin="{}"),
        cli("key", "--http", "POST", "/orders", "has space"),
        cli("key", "--http", "POST", "/orders", "k", "--jmespath", "a"),
        cli("key", stdin=json.dumps({"id": 2**60})),
        cli("key", "--hash", "crc32", stdin="{}"),
        cli("key", "--caller", "t1", stdin="{}"),
    )
    bad_json, duplicate, missing, function, http_key, http_options, wide, bad_hash = runs[:8]
    assert "use it with --http" in runs[8].error()
    assert "not valid JSON" in bad_json.error()
    assert "'a' twice" in duplicate.error()
    assert "No such file" in missing.error() and "missing.json" in missing.error()
    assert "MODULE:QUALNAME" in function.error()
    assert "invalid Idempotency-Key 'has space'" in http_key.error()
    assert "takes no --jmespath" in http_options.error()
    assert "integer" in wide.error().lower()
    assert bad_hash.code == 1 and "unknown hash_function 'crc32'" in bad_hash.error()


# ------------------------------------------------------------------------------ HTTP


async def test_http_key_finds_the_record_the_middleware_wrote(moto_endpoint: str) -> None:
    table = _table()
    store_url = _url(moto_endpoint, table)
    (await cli("create-table", "--store", store_url)).ok()

    @idempotent_endpoint
    async def create_order(request: web.Request) -> web.Response:
        return web.json_response({"order": request.match_info["order_id"]}, status=201)

    async with open_client(moto_endpoint) as client:
        manager = Manager(DynamoDBStore(client, table_name=table), Options(key_prefix="api"))
        app = web.Application(
            middlewares=[
                idempotency_middleware(
                    manager, caller_scope=lambda request: request.headers.get("x-tenant")
                )
            ]
        )
        app.router.add_post("/orders/{order_id}", create_order)
        async with TestServer(app) as server, ClientSession() as session:
            answer = await session.post(
                server.make_url("/orders/42"),
                json={"sku": "A"},
                headers={"Idempotency-Key": '"abc-1"', "X-Tenant": "t1"},
            )
            assert answer.status == 201

    http = ("key", "--prefix", "api", "--http", "post", "/orders/{order_id}")
    key_run, other_caller = await asyncio.gather(
        cli(*http, '"abc-1"', "--caller", "t1"), cli(*http, "abc-1", "--caller", "t2")
    )
    key = key_run.ok().strip()
    found, shown, missing = await asyncio.gather(
        cli("get", "--store", store_url, key, "--json", "--show-response"),
        cli("get", "--store", store_url, key, "--show-response"),
        cli("get", "--store", store_url, other_caller.ok().strip()),
    )
    record = found.json()
    assert record["status"] == "COMPLETED" and record["key"] == key
    assert record["response"]["status"] == 201
    # People see the response as the client got it: status, replayed headers, body.
    assert shown.ok().endswith(
        "response    stored:\nHTTP 201\ncontent-type: application/json; charset=utf-8\n\n"
        '{"order": "42"}\n'
    )
    assert "no record for key" in missing.error(code=3)


# ------------------------------------------------------------------------------ records


async def _populate(store: DynamoDBStore, now: float) -> dict[str, str]:
    """One record in each state; returns their keys by state."""
    manager = Manager(store, Options(key_prefix="shop", payload_validation_jmespath="amount"))
    order = {"order_id": 1, "amount": 5}
    await manager.execute(order, lambda: asyncio.sleep(0, {"charged": 5}), timeout=30)
    keys = {"completed": str(manager.key_for(order))}
    for state in ("in_progress", "lapsed", "not_stored", "expired"):
        keys[state] = f"shop#{state}"
    await store.claim(Claim(keys["in_progress"], "owner-live", now, lease=300, ttl=3600))
    await store.claim(Claim(keys["lapsed"], "owner-gone", now - 600, lease=60, ttl=3600))
    await store.claim(Claim(keys["not_stored"], "owner-big", now, lease=300, ttl=3600))
    too_large = "too large for a DynamoDB item even compressed (9000000 bytes of JSON)"
    await store.complete(
        Completion(keys["not_stored"], "owner-big", now, 3600, None, None, not_stored=too_large)
    )
    await store.claim(Claim(keys["expired"], "owner-old", now - 7200, lease=60, ttl=600))
    return keys


async def test_get_list_and_release_on_a_table(moto_endpoint: str) -> None:
    table = _table()
    store_url = _url(moto_endpoint, table)
    created = await cli("create-table", "--store", store_url)
    assert created.ok() == f"created table {table!r}, TTL on 'expiration'\n"
    now = time.time()
    async with open_client(moto_endpoint) as client:
        keys = await _populate(DynamoDBStore(client, table_name=table), now)
    populated = time.time()
    s = ("--store", store_url)
    runs = await asyncio.gather(
        cli("get", *s, keys["completed"]),
        cli("get", *s, keys["completed"], "--show-response", "--json"),
        cli("get", *s, keys["in_progress"]),
        cli("get", *s, keys["not_stored"], "--json"),
        cli("get", *s, keys["lapsed"]),
        cli("list", *s),
        cli("list", *s, "--status", "INPROGRESS", "--json", "--page-size", "2"),
        cli("list", *s, "--limit", "2", "--page-size", "1", "--progress"),
        cli("create-table", *s),
    )
    completed, completed_json, in_progress, not_stored, lapsed = runs[:5]
    listed, listed_in_progress, limited, exists = runs[5:]

    assert "status      COMPLETED" in completed.ok()
    assert "duplicates get the stored response" in completed.out
    assert "response    stored (pass --show-response to print it)" in completed.out
    assert "charged" not in completed.out  # responses only on request
    assert re.search(r"UTC \(in (59|60) min\)", completed.out)
    record = completed_json.json()
    assert record["response"] == {"charged": 5}
    assert record["state"] == "completed" and record["owner"]
    derived = KeyDeriver(Options(key_prefix="shop", payload_validation_jmespath="amount"))
    expected = derived.derive({"order_id": 1, "amount": 5})
    assert expected is not None and record["validation"] == expected.validation
    # Completed between ``now`` and ``populated`` (a client's start-up and three writes
    # later on a slow machine), with expiry ceil(completion time + 3600).
    assert now + 3600 <= record["expiration"] <= math.ceil(populated + 3600)

    assert "status      INPROGRESS" in in_progress.ok()
    assert "lease end   " in in_progress.out and re.search(r"\(in [45] min\)", in_progress.out)
    assert "owner       owner-live" in in_progress.out
    assert "refused (HTTP 409)" in in_progress.out
    assert not_stored.json()["not_stored"] == (
        "too large for a DynamoDB item even compressed (9000000 bytes of JSON)"
    )
    assert not_stored.json()["response_stored"] is False
    # Minutes are rounded: a loaded machine may take half a minute to start the CLIs.
    assert "lease ended" in lapsed.ok() and re.search(r"\((9|10) min ago\)", lapsed.out)

    rows = listed.ok().splitlines()
    assert rows[0].split() == ["STATUS", "STATE", "KEY"]
    by_key = {row.split()[-1]: row for row in rows[1:]}
    assert set(by_key) == set(keys.values())
    assert re.search(r"lease ends in [45] min", by_key[keys["in_progress"]])
    assert re.search(r"lease lapsed (9|10) min ago", by_key[keys["lapsed"]])
    assert "expired 2 h ago" in by_key[keys["expired"]]
    assert "response not stored" in by_key[keys["not_stored"]]
    assert listed.err == "5 records (read 5 items)\n"
    in_progress_keys = {json.loads(line)["key"] for line in listed_in_progress.ok().splitlines()}
    assert in_progress_keys == {keys["in_progress"], keys["lapsed"], keys["expired"]}
    assert listed_in_progress.err == "3 records (read 5 items)\n"  # three pages, filtered
    assert len(limited.ok().splitlines()) == 1 + 2
    progress = limited.err.splitlines()
    # The limit fell on a page's end: one page more told that more remain.
    assert progress == [
        "1 items read, 1 listed…",
        "2 items read, 2 listed…",
        "2 records shown, stopped at --limit 2: more remain (read 3 items)",
    ]
    assert exists.error() == f"table {table!r} already exists"

    # release: asks first, shows what it deleted, refuses without a yes.
    declined = await cli("release", *s, keys["in_progress"], stdin="n\n")
    assert declined.code == 1 and "may still be running" in declined.err
    assert "Delete this record? [y/N]" in declined.err
    assert "not released" in declined.err.splitlines()[-1]
    confirmed, forced = await asyncio.gather(
        cli("release", *s, keys["in_progress"], stdin="y\n"),
        cli("release", *s, keys["completed"], "--yes", "--json"),
    )
    assert confirmed.ok().startswith("deleted:\n  key         shop#in_progress\n")
    assert "owner       owner-live" in confirmed.out
    assert forced.json()["deleted"]["key"] == keys["completed"]
    gone, gone_again, remaining = await asyncio.gather(
        cli("get", *s, keys["in_progress"]),
        cli("release", *s, keys["completed"], "--yes"),
        cli("list", *s, "--json"),
    )
    assert "no record" in gone.error(code=3)
    assert "no record" in gone_again.error(code=3)
    assert len(remaining.ok().splitlines()) == 3


async def test_sort_key_mode_with_renamed_attributes(moto_endpoint: str) -> None:
    table = _table()
    layout = {
        "key_attr": "pk",
        "sort_key_attr": "sk",
        "static_pk_value": "idempotency#checkout",
        "expiry_attr": "ttl",
        "status_attr": "state",
    }
    store_url = _url(moto_endpoint, table, **layout)
    created = await cli("create-table", "--store", store_url)
    assert created.ok() == f"created table {table!r}, sort key 'sk', TTL on 'ttl'\n"
    now = time.time()
    async with open_client(moto_endpoint) as client:
        description = await client.describe_table(TableName=table)
        schema = {key["AttributeName"]: key["KeyType"] for key in description["Table"]["KeySchema"]}
        assert schema == {"pk": "HASH", "sk": "RANGE"}
        ttl = await client.describe_time_to_live(TableName=table)
        assert ttl["TimeToLiveDescription"]["AttributeName"] == "ttl"
        store = DynamoDBStore(client, table_name=table, **layout)
        other = DynamoDBStore(client, table_name=table, **{**layout, "static_pk_value": "other"})
        manager = Manager(store, Options(key_prefix="checkout"))
        await manager.execute({"cart": 1}, lambda: asyncio.sleep(0, "paid"), timeout=30)
        await store.claim(Claim("checkout#held", "owner-1", now, lease=300, ttl=3600))
        await other.claim(Claim("elsewhere#1", "owner-2", now, lease=300, ttl=3600))
    s = ("--store", store_url)
    listed, completed, got = await asyncio.gather(
        cli("list", *s, "--json"),
        cli("list", *s, "--status", "COMPLETED", "--json"),
        cli("get", *s, "checkout#held", "--json"),
    )
    listed_keys = {json.loads(line)["key"] for line in listed.ok().splitlines()}
    assert listed_keys == {"checkout#held", manager.key_for({"cart": 1})}  # its partition only
    assert [json.loads(line)["status"] for line in completed.ok().splitlines()] == ["COMPLETED"]
    assert got.json()["owner"] == "owner-1"


async def test_list_limit_reads_what_it_shows_and_says_whether_more_remain(
    moto_endpoint: str,
) -> None:
    table = _table()
    store_url = _url(moto_endpoint, table)
    now = time.time()
    async with open_client(moto_endpoint) as client:
        await create_table(client, table)
        store = DynamoDBStore(client, table_name=table)
        for i in range(5):
            await store.claim(Claim(f"shop#{i}", "owner", now, lease=300, ttl=3600))
            if i >= 3:
                await store.complete(Completion(f"shop#{i}", "owner", now, 3600, None, None))
    s = ("--store", store_url)
    two, five, held_two, held_three = await asyncio.gather(
        cli("list", *s, "--limit", "2"),
        cli("list", *s, "--limit", "5", "--json"),
        cli("list", *s, "--limit", "2", "--status", "INPROGRESS"),
        cli("list", *s, "--limit", "3", "--status", "INPROGRESS"),
    )
    # Unfiltered, a request reads one item past the limit (not a 1 MB page of them), and
    # that item says that more remain.
    assert len(two.ok().splitlines()) == 1 + 2
    assert two.err == "2 records shown, stopped at --limit 2: more remain (read 3 items)\n"
    assert len(five.ok().splitlines()) == 5
    assert five.err == "5 records (read 5 items)\n"  # all of them: nothing more to say
    # A status filter applies after DynamoDB's Limit: the page is the table's 1 MB page.
    assert len(held_two.ok().splitlines()) == 1 + 2
    assert held_two.err == "2 records shown, stopped at --limit 2: more remain (read 5 items)\n"
    assert len(held_three.ok().splitlines()) == 1 + 3
    assert held_three.err == "3 records (read 5 items)\n"


async def test_list_limit_says_when_it_cannot_tell_whether_more_remain(
    moto_endpoint: str,
) -> None:
    # Sort-key mode lists in key order (a Query of the partition): k1 and k3 in progress.
    table = _table()
    layout = {"sort_key_attr": "sk", "static_pk_value": "idempotency#shop"}
    store_url = _url(moto_endpoint, table, **layout)
    now = time.time()
    async with open_client(moto_endpoint) as client:
        await create_table(client, table, sort_key=True)
        store = DynamoDBStore(client, table_name=table, **layout)
        for key in ("k1", "k2", "k3"):
            await store.claim(Claim(key, "owner", now, lease=300, ttl=3600))
        await store.complete(Completion("k2", "owner", now, 3600, None, None))
    s = ("--store", store_url, "--status", "INPROGRESS", "--page-size", "1")
    one, two = await asyncio.gather(
        cli("list", *s, "--limit", "1"), cli("list", *s, "--limit", "2")
    )
    # k1 filled the limit at a page's end; the one page read past it (k2) held no match.
    assert [row.split()[-1] for row in one.ok().splitlines()[1:]] == ["k1"]
    assert one.err == "1 record shown, stopped at --limit 1: there may be more (read 2 items)\n"
    assert [row.split()[-1] for row in two.ok().splitlines()[1:]] == ["k1", "k3"]
    # k3 filled it at the partition's end: DynamoDB said no more (no LastEvaluatedKey).
    assert two.err == "2 records (read 3 items)\n"


def test_list_and_vacuum_help_say_what_the_options_do_and_their_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from idempotency_async.cli._parser import build_parser

    helps = {}
    for command in ("list", "vacuum"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        helps[command] = " ".join(capsys.readouterr().out.split())
    page_size = helps["list"].split("--page-size N ", 1)[1]
    for default in (
        "1 MB",
        "SCAN COUNT (default 100)",
        "Postgres rows per statement (default 1000)",
    ):
        assert default in page_size
    assert "--limit N show at most N records" in helps["list"]
    assert "whether more remain" in helps["list"]
    assert "rows deleted per statement (default 1000)" in helps["vacuum"]
    assert "(default: until none is left)" in helps["vacuum"]


# ------------------------------------------------------------------------------ errors


async def test_store_mistakes_are_one_line_errors(moto_endpoint: str, tmp_path: Path) -> None:
    missing = _url(moto_endpoint, "no-such-table")
    # An environment without the dynamodb extra: aioboto3 fails to import.
    (tmp_path / "aioboto3").mkdir()
    (tmp_path / "aioboto3" / "__init__.py").write_text("raise ImportError('no aioboto3')")
    no_extra = cli_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    no_region = f"dynamodb://some-table?endpoint={quote(moto_endpoint, safe='')}"
    runs = await asyncio.gather(
        cli("get", "--store", missing, "k"),
        cli("get", "--store", "mysql://db/x", "k"),
        cli("get", "--store", f"{missing}&colour=blue", "k"),
        cli("get", "--store", "dynamodb://a?region=x", "k"),
        cli("get", "k"),
        cli("get", "--store", missing, "k", env=cli_env(AWS_ACCESS_KEY_ID=None)),
        cli("get", "--store", no_region, "k"),
        cli("get", "--store", missing, "--profile", "nobody", "k"),
        cli("create-table", "--store", "redis://127.0.0.1:1/0"),
        cli("list", "--store", missing, "--limit", "0"),
        cli("list", env=cli_env(IDEMPOTENCY_ASYNC_STORE=missing)),
        cli(
            "get",
            "--store",
            _url("http://127.0.0.1:9", "some-table"),
            "k",
            env=cli_env(AWS_MAX_ATTEMPTS="1"),
        ),
        cli("get", "--store", missing, "k", env=no_extra),
    )
    unknown, scheme, param, name, no_store, no_credentials, region, profile = runs[:8]
    redis_table, zero, from_environment, unreachable, without_extra = runs[8:]
    assert "ResourceNotFoundException" in unknown.error() and "no-such-table" in unknown.err
    assert "scheme must be one of dynamodb://" in scheme.error()
    assert "unknown parameter 'colour'" in param.error()
    assert "bad table name 'a'" in name.error()
    assert "no store given" in no_store.error()
    assert "no AWS credentials" in no_credentials.error()
    assert "no AWS region" in region.error()
    assert "nobody" in profile.error() and "could not be found" in profile.err
    assert "create-table is for dynamodb://" in redis_table.error()
    assert zero.code == 2 and "must be at least 1" in zero.err
    assert "ResourceNotFoundException" in from_environment.error()
    assert "pip install 'idempotency-async[dynamodb]'" in without_extra.error()
    assert unreachable.error().endswith(
        "check the endpoint and region in the store URL, and the network"
    )


async def test_redis_url_without_the_redis_extra_says_what_to_install(tmp_path: Path) -> None:
    # An environment without the redis extra: redis-py fails to import.
    (tmp_path / "redis").mkdir()
    (tmp_path / "redis" / "__init__.py").write_text("raise ImportError('no redis')")
    no_extra = cli_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    run = await cli("get", "--store", "redis://127.0.0.1:6379/0", "k", env=no_extra)
    assert "pip install 'idempotency-async[redis]'" in run.error()


async def test_console_script_and_module_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["idempotency-async"] == "idempotency_async.cli:main"
    from idempotency_async.cli import main

    assert callable(main)
    run, usage = await asyncio.gather(cli("--version"), cli())
    assert run.ok().startswith("idempotency-async ")
    assert usage.code == 2 and "COMMAND" in usage.err


async def test_key_in_the_powertools_python_format_equals_the_real_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import _powertools_corpus as corpus

    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    payload = {"order": {"id": "o-1", "Name": "café", "amount": 12.5, "lines": [1, 2]}}
    case = corpus.Case(
        "cli", payload, event_key_jmespath="order", validation_jmespath="order.amount"
    )
    expected = corpus.powertools_keys(case)
    assert expected is not None
    (tmp_path / "payload.json").write_text(json.dumps(payload))
    run = await cli(
        "key",
        str(tmp_path / "payload.json"),
        "--key-format",
        "powertools-python",
        "--function",
        f"{corpus.process_order.__module__}:{corpus.process_order.__qualname__}",
        "--jmespath",
        "order",
        "--validation-jmespath",
        "order.amount",
        "--json",
    )
    got = run.json()
    assert (got["key"], got["validation"]) == expected
    assert got["key"].startswith("test-func._powertools_corpus.process_order#")


# ------------------------------------------------------------------------------ secrets

PASSWORD = "S3cr3t-pw%21"  # percent-encoded "!": the decoded form must not show either


async def test_store_urls_never_show_their_password() -> None:
    urls = {
        "port": f"redis://admin:{PASSWORD}@127.0.0.1:6379x/0",
        "parameter": f"redis://admin:{PASSWORD}@127.0.0.1:6379/0?socket_timeout=soon",
        "field": f"dynamodb://table?region=eu-west-1&{PASSWORD}",
        "ipv6": f"redis://admin:{PASSWORD}@[::1:6379/0",
        "scheme": f"rediz://admin:{PASSWORD}@127.0.0.1:6379/0",
        "table": f"dynamodb://admin:{PASSWORD}@table?region=eu-west-1",
        "cluster": f"redis://admin:{PASSWORD}@127.0.0.1:1/0?cluster=true",
        "query": f"redis://127.0.0.1:6379/0?password={PASSWORD}&socket_timeout=soon",
    }
    runs = await asyncio.gather(*(cli("get", "--store", url, "k") for url in urls.values()))
    messages = dict(zip(urls, (run.error() for run in runs), strict=True))
    for what, message in messages.items():
        for secret in (PASSWORD, "S3cr3t-pw!", "S3cr3t"):
            assert secret not in message, (what, message)
    assert "'redis://admin:***@127.0.0.1:6379x/0'" in messages["port"]
    assert "socket_timeout" in messages["parameter"]
    assert "NAME=VALUE" in messages["field"]
    assert "Invalid IPv6 URL" in messages["ipv6"]
    assert "scheme must be one of" in messages["scheme"]
    assert "bad table name" in messages["table"]
    # An unreachable cluster: one line (error() checks it), whoever translates the error.
    assert "127.0.0.1" in messages["cluster"] or "luster" in messages["cluster"]
    assert "password=***" in messages["query"]


def test_redis_from_url_errors_never_quote_the_password() -> None:
    redis_store = pytest.importorskip("idempotency_async.stores.redis")
    from idempotency_async.errors import ConfigError

    for url in (
        f"redis://admin:{PASSWORD}@127.0.0.1:6379x/0",
        f"redis://admin:{PASSWORD}@127.0.0.1:6379/0?socket_timeout=soon",
        f"redis://admin:{PASSWORD}@[::1:6379/0",
        f"rediz://admin:{PASSWORD}@127.0.0.1:6379/0",
    ):
        with pytest.raises(ConfigError) as caught:
            redis_store.RedisStore.from_url(url)
        assert "S3cr3t" not in str(caught.value) and "admin:***@" in str(caught.value)


async def test_passwords_holding_url_delimiters_never_show() -> None:
    # "/", "#", "?" in a password end the authority for a parser: exactly the URLs that
    # fail to parse and get quoted in an error.
    urls = {
        "scheme": "foo://u:se/cret@h",
        "port": "redis://user:p#ssw0rd@127.0.0.1:bad/0",
        "query": "redis://user:wh?atever@127.0.0.1:bad/0",
    }
    runs = await asyncio.gather(*(cli("get", "--store", url, "k") for url in urls.values()))
    messages = dict(zip(urls, (run.error() for run in runs), strict=True))
    for secret in ("se/cret", "p#ssw0rd", "wh?atever"):
        for what, message in messages.items():
            assert secret not in message, (what, message)
    assert "'foo://u:***@h'" in messages["scheme"]


async def test_mistyped_schemes_and_ports_never_show_the_password() -> None:
    # "postgres//" and "rediss//" have no scheme for a parser: the URL was quoted whole; a
    # port that is not a number ended in asyncpg's traceback.
    urls = {  # (rediss//: the same parse; RedisStore.from_url's own error below)
        "postgres-scheme": f"postgres//admin:{PASSWORD}@127.0.0.1/db",
        "postgres-port": f"postgres://admin:{PASSWORD}@127.0.0.1:abc/db",
    }
    runs = await asyncio.gather(*(cli("get", "--store", url, "k") for url in urls.values()))
    messages = dict(zip(urls, (run.error() for run in runs), strict=True))
    for what, message in messages.items():
        for secret in (PASSWORD, "S3cr3t-pw!", "S3cr3t"):
            assert secret not in message, (what, message)
        assert "admin:***@" in message, (what, message)
    assert "scheme must be one of" in messages["postgres-scheme"]
    assert "abc" in messages["postgres-port"]


def test_redis_from_url_hides_a_password_after_a_mistyped_scheme() -> None:
    redis_store = pytest.importorskip("idempotency_async.stores.redis")
    from idempotency_async.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        redis_store.RedisStore.from_url(f"rediss//admin:{PASSWORD}@host")
    assert "S3cr3t" not in str(caught.value) and "admin:***@" in str(caught.value)


def test_redis_from_url_hides_a_password_holding_a_hash() -> None:
    redis_store = pytest.importorskip("idempotency_async.stores.redis")
    from idempotency_async.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        redis_store.RedisStore.from_url("redis://user:p#ssw0rd@host:bad")
    assert "p#ss" not in str(caught.value) and "user:***@" in str(caught.value)


def test_store_targets_do_not_show_their_password_in_repr() -> None:
    from idempotency_async.cli._schemes import parse_target

    for url in ("redis://user:S3cr3tpw@127.0.0.1:6379/0", "postgres://user:S3cr3tpw@h/db"):
        target = parse_target(url)
        assert "S3cr3tpw" not in repr(target), repr(target)


async def test_release_with_stdin_closed_deletes_nothing(moto_endpoint: str) -> None:
    table = _table()
    store_url = _url(moto_endpoint, table)
    (await cli("create-table", "--store", store_url)).ok()
    async with open_client(moto_endpoint) as client:
        store = DynamoDBStore(client, table_name=table)
        await store.claim(Claim("shop#held", "owner-1", time.time(), lease=300, ttl=3600))
    closed = await cli("release", "--store", store_url, "shop#held", close_stdin=True)
    assert "stdin is closed" in closed.error() and "--yes" in closed.err
    still = await cli("get", "--store", store_url, "shop#held", "--json")
    assert still.json()["owner"] == "owner-1"


async def test_powertools_format_records_are_addressable_on_dynamodb(moto_endpoint: str) -> None:
    table = _table()
    (await cli("create-table", "--store", _url(moto_endpoint, table))).ok()
    response = {"charge_id": "ch_1", "amount": 5}
    async with open_client(moto_endpoint) as client:
        store = DynamoDBStore(client, table_name=table, record_format="powertools-python")
        manager = Manager(store, Options(key_prefix="shop", key_format="powertools-python"))
        await manager.execute({"order": 1}, lambda: asyncio.sleep(0, response), timeout=30)
    key = str(manager.key_for({"order": 1}))
    python_url = _url(moto_endpoint, table, record_format="powertools-python")
    right, listed, wrong, bad = await asyncio.gather(
        cli("get", "--store", python_url, key, "--show-response", "--json"),
        cli("list", "--store", python_url, "--json"),
        cli("get", "--store", _url(moto_endpoint, table), key, "--show-response", "--json"),
        cli("get", "--store", _url(moto_endpoint, table, record_format="json"), key),
    )
    assert right.json()["response"] == response
    assert json.loads(listed.ok())["key"] == key
    assert isinstance(wrong.json()["response"], str)  # the JSON text, read as the other layout
    assert "record_format= in the store URL must be one of" in bad.error()
